"""The store's answers and the listener it tells of timer records: the types its callers see."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from gms.store_errors import StoreError

GET_BYTES_MAX_DEFAULT = 4 << 20
LOST_ENTRY_SIZE = 1  # a consumeQueue entry for a record recovery could not find: answered as damaged


class GetStatus(enum.Enum):
    FOUND = "found"
    NO_NEW_MESSAGE = "no_new_message"  # offset == max: nothing yet (long-poll here)
    NO_MATCHED_MESSAGE = "no_matched_message"  # entries scanned, none matched the tag filter
    OFFSET_TOO_SMALL = "offset_too_small"  # below the minimum (expired): restart at next_offset
    OFFSET_OVERFLOW = "offset_overflow"  # beyond the end of the queue


class GetResult(NamedTuple):
    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[memoryview]  # zero-copy views of stored records (send them as-is)
    # (queue offset, commitlog offset) of records in the answered range whose CRC fails: left
    # out of ``records`` (damage is never served as data), their offsets consumed all the same
    damaged: tuple[tuple[int, int], ...] = ()
    offsets: np.ndarray | None = None  # the queue offsets of the records served (status FOUND)


class QueueGet(NamedTuple):
    """One queue of a many-queue read (:meth:`StoreReads.get_many`): from ``offset``, below
    ``read_limit`` (a replicated queue's high watermark; None: its end)."""

    topic: str
    queue_id: int
    offset: int
    read_limit: int | None = None


# (a commitlog file's view, starts of records in it) -> which of those records to serve (bool mask)
RecordSelector = Callable[[memoryview, np.ndarray], np.ndarray]


class TimerRecord(NamedTuple):
    """A stored record the timer service follows: scheduled, a delivered copy or a cancel."""

    topic: str
    queue_id: int
    queue_offset: int
    phys: int
    flags: int  # its TIMER_FLAGS


class TimerListener(Protocol):
    """What the broker's timer service hears from the store (on the writing thread)."""

    def appended(self, records: list[TimerRecord]) -> None:
        """Records with timer flags were stored (client, replicated or the timer's own)."""

    def truncated(self, topic: str, queue_id: int) -> None:
        """A queue was cut back or restarted: what the timer knows of it may be gone."""

    def deleted(self, topic: str) -> None:
        """A topic was deleted, records and all."""


class NoTimers:
    """The timer listener until the broker sets its own."""

    def appended(self, records: list[TimerRecord]) -> None:
        pass

    def truncated(self, topic: str, queue_id: int) -> None:
        pass

    def deleted(self, topic: str) -> None:
        pass


class AppendResult(NamedTuple):
    end_phys_offset: int  # wait for durable_future(end_phys_offset) to know the batch is on disk
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    phys_offsets: np.ndarray
    touched_queues: list[tuple[str, int]]  # the (topic, queue id) pairs the batch appended to
    queue_counts: list[int]  # how many records went to each of them
    queue_bytes: list[int]  # and how many bytes
    queue_ends: list[int]  # and the end of each after it (its max offset)


class ReplicaRead(NamedTuple):
    """A follower's fetch read of one queue (:meth:`MessageStore.read_runs`)."""

    next_offset: int
    views: list[memoryview]  # the intact records, adjacent ones in one view
    size: int  # their bytes
    sizes: np.ndarray  # int64, each intact record's size, in offset order
    damaged: np.ndarray  # int64 queue offsets of the range held damaged (or lost): not in ``views``


class RepairOutcome(enum.Enum):
    REPAIRED = "repaired"  # the damaged copy was rewritten from the given one
    INTACT = "intact"  # the stored copy was not damaged: nothing written


class ReplicaGap(StoreError):
    """Replicated records do not continue their queue (the follower must truncate or refetch)."""


class StoreStats(NamedTuple):
    min_offset: int  # first commitlog byte still kept
    max_offset: int  # end of the written commitlog
    disk_used_bytes: int  # what the store's directory takes on disk (``du``: allocated blocks)
