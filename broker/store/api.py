"""What the broker's services need of the store: the one interface a store implementation
offers them (tests/store/test_store_conformance.py runs the same suite against each)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

from gms.broker.commitlog.flush import FlushListener
from gms.broker.keyindex import TIME_MAX_MS
from gms.broker.store.health import StoreHealth
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store.types import (
    GET_BYTES_MAX_DEFAULT,
    AppendResult,
    GetResult,
    QueueGet,
    RecordSelector,
    StoreStats,
)
from gms.broker.store_config import StoreConfig
from gms.record.layout import PRODUCER_FLAGS
from gms.store_errors import StoreError


class StoreAPI(Protocol):
    """Sends, reads by offset, time, position, key or a leader's message id, topics, the queue
    cuts replication makes and retention runs. Errors are those of ``gms.store_errors``."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def health(self) -> StoreHealth: ...

    @property
    def flushed_offset(self) -> int:
        """The commitlog offset on disk."""

    def close(self) -> None: ...

    # --- sends --------------------------------------------------------------------------------------
    def append(self, records: bytes | bytearray | memoryview,
               admit: Callable[[list[tuple[str, int]]], None] | None = None, *,
               allowed_flags: int = PRODUCER_FLAGS) -> AppendResult:
        """Store a batch of encoded records (or one), all or nothing."""

    def batch_result(self, key: tuple[str, int], base_offset: int, count: int) -> AppendResult:
        """The AppendResult of records stored before (an idempotent producer's duplicate)."""

    def durable_future(self, phys_offset: int) -> Future:
        """Resolved once the commitlog is on disk up to ``phys_offset``."""

    def request_flush(self, phys_offset: int) -> None:
        """``durable_future`` without the future: flush listeners hear when it is done."""

    def add_flush_listener(self, listener: FlushListener) -> None:
        """``listener(flushed_offset, error)`` runs in the flush thread after every flush."""

    # --- reads ----------------------------------------------------------------------------------------
    def get(self, topic: str, queue_id: int, offset: int, max_msgs: int = 32,
            max_bytes: int = GET_BYTES_MAX_DEFAULT, tag_hashes: frozenset[int] | None = None,
            read_limit: int | None = None, coalesce: bool = False, select: RecordSelector | None = None) -> GetResult:
        """Records of a queue from ``offset``."""

    def get_many(self, queues: Sequence[QueueGet], max_msgs: int = 32, max_bytes: int = GET_BYTES_MAX_DEFAULT,
                 total_bytes: int = GET_BYTES_MAX_DEFAULT) -> list[GetResult | StoreError]:
        """``get(..., coalesce=True)`` of many queues in order, within a total of bytes: the list
        stops before the first queue reached once it is spent; a queue's error in its place."""

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after ``ts_ms``."""

    def read_entry(self, topic: str, queue_id: int, offset: int) -> memoryview:
        """The record at a queue offset, hidden ones included."""

    def read_at(self, phys_offset: int) -> memoryview:
        """The record at a commitlog offset (a message id)."""

    def find_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = TIME_MAX_MS,
                    max_messages: int = 32) -> list[memoryview]:
        """Records of ``topic`` carrying ``key``, newest first."""

    def find_replicated(self, leader: str, leader_phys: int) -> memoryview | None:
        """This store's copy of a record a leader stored at ``leader_phys``."""

    # --- topics ---------------------------------------------------------------------------------------
    def create_topic(self, name: str, queue_count: int, limits: TopicLimits | None = None) -> None: ...

    def create_topics_async(self, topics: Mapping[str, tuple[int, TopicLimits]]) -> Future[None]: ...

    def update_topic_async(self, name: str, queue_count: int | None = None,
                           limits: TopicLimits | None = None) -> Future[None]: ...

    def delete_topics(self, names: Iterable[str]) -> Future[None]: ...

    def topic_limits(self, name: str) -> TopicLimits: ...

    def topics(self) -> dict[str, int]:
        """Topic name -> queue count."""

    def queue_count(self, topic: str) -> int | None:
        """``topic``'s queue count (None: no such topic), without copying the table as ``topics`` does."""

    def stats(self) -> StoreStats: ...

    # --- replication and retention --------------------------------------------------------------------
    def truncate_queue(self, topic: str, queue_id: int, offset: int) -> None:
        """Cut a queue back to ``offset`` (a follower of a new leader), durably."""

    def delete_expired(self, now_ms: int | None = None) -> int:
        """A retention run as of ``now_ms``; the number of commitlog files deleted."""

    def delete_records(self, topic: str, queue_id: int, offset: int) -> int:
        """Serve the queue from ``offset`` on only (at most its expiry limit); its minimum."""
