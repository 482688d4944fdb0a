"""What follows an append: the after-append steps as a list of dispatchers (RocketMQ's
``CommitLogDispatcher``). Each is told of every batch stored in the commitlog -- by a live append
or, for the indexes, by recovery re-reading the commitlog -- and keeps its own index or state.

The indexes (key index, producer state, consumeQueue) are told before the append commits: if
one fails the write is undone and leaves no trace, and the consumeQueue goes last, so a queue's
new end is published once every index has the batch. The followers (timers, origins) are told
once the batch is committed (readers may have it); recovery rebuilds the indexes only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple, Protocol, cast

import numpy as np

from gms.broker.consumequeue.consume_queue import CQ_DTYPE, ConsumeQueue
from gms.broker.keyindex import KeyIndex, keys_field
from gms.broker.store.origins import OriginMap, leader_key, runs
from gms.broker.store.producer_state import ProducerStates
from gms.broker.store.queues import QueueGroup
from gms.broker.store.types import NoTimers, TimerListener, TimerRecord
from gms.record.batch import OneRecord, ParsedRecords
from gms.record.layout import FLAG_SEQUENCED, TIMER_FLAGS
from gms.record.sequence import BatchSequence, read_sequence
from gms.store_errors import InvalidRecord

log = logging.getLogger(__name__)


class Appended(NamedTuple):
    """A batch stored in the commitlog, as the dispatchers see it."""

    records: np.ndarray  # uint8: holds the records at parsed.starts (the batch sent, or a commitlog file)
    parsed: ParsedRecords
    groups: list[QueueGroup]  # the queues to index it in, their entries reserved
    counts: list[int]  # each group's records
    bases: list[int]  # each group's first queue offset (its queue's end before the batch)
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    phys: np.ndarray
    sizes: np.ndarray
    tag_hashes: np.ndarray  # as indexed (hidden records: HIDDEN_TAG_HASH)
    store_ts_ms: np.ndarray
    flag_union: int  # the flags of all records or'ed: most batches have none
    sequences: Mapping[int, BatchSequence]  # stamps read already (by the validator), by record index
    origin: str | None  # the leader replicated records came from


class Dispatcher(Protocol):
    # The single records it is told of: 0 every one, else those carrying one of these flags;
    # None: none (a single record is a producer's send, on the path that costs no numpy call).
    single_records: int | None

    def dispatch(self, batch: Appended) -> None:
        """A batch was stored."""

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        """A single record was stored: ``record`` as parsed from ``buf``, now at ``queue_offset`` of
        ``cq`` and ``phys`` in the commitlog; ``sequence``: its idempotent producer's stamp."""


class Dispatchers(NamedTuple):
    before_commit: tuple[Dispatcher, ...]  # the indexes: undone with the write if one fails; recovery rebuilds them
    after_commit: tuple[Dispatcher, ...]  # told once readers may have the records
    timers: TimerDispatcher  # (one of after_commit) the broker's timer service listens here


def dispatchers(keys: KeyIndex, producers: ProducerStates, origins: OriginMap) -> Dispatchers:
    """The store's dispatchers, in the order they are told."""
    timers = TimerDispatcher()
    return Dispatchers((KeyIndexDispatcher(keys), ProducerStateDispatcher(producers), ConsumeQueueDispatcher()),
                       (timers, OriginDispatcher(origins)), timers)


class ConsumeQueueDispatcher:
    """One consumeQueue entry per record, then every queue's new end: never seen half indexed."""

    single_records: int | None = 0

    def dispatch(self, batch: Appended) -> None:
        n = len(batch.phys)
        entries = np.empty(n, CQ_DTYPE)
        entries["phys"] = batch.phys
        entries["size"] = batch.sizes
        entries["tag_hash"] = batch.tag_hashes
        groups, bases = batch.groups, batch.bases
        if not groups:  # recovery: every queue of these records was reconciled entry by entry
            return
        if isinstance(groups[0].indices, slice):  # each queue's records in a row: its entries' bytes
            raw, unit = entries.view(np.uint8).data, CQ_DTYPE.itemsize
            for (cq, idx, _), base, count in zip(groups, bases, batch.counts, strict=True):
                start = cast(slice, idx).start or 0
                cq.write_raw(base, raw[start * unit: (start + count) * unit])
        else:
            for (cq, idx, _), base in zip(groups, bases, strict=True):  # the entries of a queue go in with one copy
                cq.write(base, entries[idx])
        for (cq, _, _), base, count in zip(groups, bases, batch.counts, strict=True):
            cq.publish(base + count)

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        cq.write_one(queue_offset, phys, record.size, record.tag_hash)
        cq.publish(queue_offset + 1)


class KeyIndexDispatcher:
    """The records' keys, for lookups by key (gms.broker.keyindex)."""

    single_records: int | None = 0

    def __init__(self, keys: KeyIndex) -> None:
        self._keys = keys

    def dispatch(self, batch: Appended) -> None:
        self._keys.add(batch.records, batch.parsed, batch.phys, batch.store_ts_ms)

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        self._keys.add_one(record.topic, keys_field(buf), phys, store_ts_ms)


class ProducerStateDispatcher:
    """Idempotent producers' last batches follow the stamped records stored (sent, replicated or
    re-read by recovery): before the commit, so a checkpoint that covers a batch knows it."""

    single_records: int | None = FLAG_SEQUENCED

    def __init__(self, producers: ProducerStates) -> None:
        self._producers = producers

    def dispatch(self, batch: Appended) -> None:
        if not batch.flag_union & FLAG_SEQUENCED:
            return
        parsed = batch.parsed
        headers, topics = parsed.headers, parsed.topics
        stamped = np.flatnonzero(headers["flags"] & FLAG_SEQUENCED)
        for i, topic_index, queue_id, start, queue_offset, at, ts_ms in zip(
                stamped.tolist(), parsed.topic_index[stamped].tolist(), headers["queue_id"][stamped].tolist(),
                parsed.starts[stamped].tolist(), batch.queue_offsets[stamped].tolist(), batch.phys[stamped].tolist(),
                batch.store_ts_ms[stamped].tolist(), strict=True):
            key = (topics[topic_index], queue_id)
            sequence = batch.sequences.get(i)
            if sequence is None:
                try:
                    sequence = read_sequence(batch.records, start)
                except InvalidRecord as err:  # stored already: only the producer state misses it
                    log.warning("%s/%d@%d: %s", *key, queue_offset, err)
                    continue
            self._producers.appended(key, sequence, queue_offset, at, ts_ms)

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        if sequence is not None:
            self._producers.appended((record.topic, record.queue_id), sequence, queue_offset, phys, store_ts_ms)


class TimerDispatcher:
    """Records with timer flags (scheduled, delivered copies, cancels), for the timer service."""

    single_records: int | None = TIMER_FLAGS

    def __init__(self) -> None:
        self.listener: TimerListener = NoTimers()

    def dispatch(self, batch: Appended) -> None:
        if not batch.flag_union & TIMER_FLAGS:
            return
        timer_flags = batch.parsed.headers["flags"] & TIMER_FLAGS
        parsed, queue_ids, queue_offsets, phys = batch.parsed, batch.queue_ids, batch.queue_offsets, batch.phys
        self.listener.appended([
            TimerRecord(parsed.topics[int(parsed.topic_index[i])], int(queue_ids[i]), int(queue_offsets[i]),
                        int(phys[i]), int(timer_flags[i]))
            for i in np.flatnonzero(timer_flags).tolist()])

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        if record.flags & TIMER_FLAGS:
            self.listener.appended([TimerRecord(record.topic, record.queue_id, queue_offset, phys,
                                                record.flags & TIMER_FLAGS)])


class OriginDispatcher:
    """Where replicated records lay on their leader (its envelopes, in the records fetched), so
    its message ids resolve here too (gms.broker.store.origins)."""

    single_records: int | None = None  # a single record is a producer's: it has no origin

    def __init__(self, origins: OriginMap) -> None:
        self._origins = origins

    def dispatch(self, batch: Appended) -> None:
        if batch.origin is None:
            return
        try:
            self._origins.add(runs(batch.parsed.headers["phys_offset"].astype(np.int64), batch.phys,
                                   batch.sizes, leader_key(batch.origin)))
        except OSError as err:  # stored and committed: only their leader's message ids miss them here
            log.warning("message ids of %d record(s) from %s will not resolve on this replica: %s",
                        len(batch.phys), batch.origin, err)

    def dispatch_one(self, record: OneRecord, buf: memoryview, cq: ConsumeQueue, queue_offset: int, phys: int,
                     store_ts_ms: int, sequence: BatchSequence | None) -> None:
        pass  # never told (single_records is None)
