"""The store's open consumeQueues, one per (topic, queue id) that ever held a record, and the
split of a batch by queue."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np

from gms.broker.consumequeue.consume_queue import ConsumeQueue, OffsetExpired
from gms.broker.consumequeue.min_offsets import save_min_offsets
from gms.broker.mapped_file import PendingDirSyncs
from gms.broker.store.paths import StorePaths
from gms.broker.store.topic_table import QUEUE_COUNT_MAX, TopicTable
from gms.record.batch import ParsedRecords
from gms.store_errors import StoreError, UnknownQueue

QueueKey = tuple[str, int]


class QueueGroup(NamedTuple):
    queue: ConsumeQueue
    indices: np.ndarray | slice  # the batch's records of this queue, in batch order
    key: QueueKey


def group_size(indices: np.ndarray | slice, n: int) -> int:
    """How many of a batch's ``n`` records a queue group holds."""
    if isinstance(indices, slice):
        return (n if indices.stop is None else indices.stop) - (indices.start or 0)
    return len(indices)


def group_counts(groups: list[QueueGroup], n: int) -> list[int]:
    """How many of a batch's ``n`` records each group holds (once per append: its steps share them)."""
    return [group_size(group.indices, n) for group in groups]


def group_bytes(groups: list[QueueGroup], sizes: np.ndarray) -> list[int]:
    """The bytes of each group's records (groups of records in a row: one numpy call for all)."""
    if len(groups) > 1 and isinstance(groups[0].indices, slice):
        return np.add.reduceat(sizes, [cast(slice, g.indices).start for g in groups]).tolist()
    return [int(sizes[g.indices].sum()) for g in groups]


class QueueTable:
    """The consumeQueues of the topics in ``topics``, opened on first use (or at load, those with
    index files). Lookups take no lock; opening one takes ``lock``."""

    def __init__(self, paths: StorePaths, topics: TopicTable, entries_per_file: int) -> None:
        self._paths = paths
        self._topics = topics
        self._entries_per_file = entries_per_file
        self.by_key: dict[QueueKey, ConsumeQueue] = {}
        # Order: the store's write lock, then its index lock, then this one.
        self.lock = threading.Lock()
        # Parents of queue directories made ahead of their first appends, synced by the checkpoint.
        self.dir_syncs = PendingDirSyncs()

    def load(self) -> None:
        """Open the queues that have index files (those that ever held data: an empty queue has
        an empty directory or none) with one listing of the consumeQueue root, not a look-up per
        known topic."""
        topics = self._topics.snapshot()
        try:
            with os.scandir(self._paths.consumequeue) as entries:
                topic_dirs = [Path(e.path) for e in entries if e.name in topics and e.is_dir()]
        except FileNotFoundError:
            return
        for topic_dir in topic_dirs:
            for qdir in topic_dir.iterdir():
                if qdir.name.isdigit() and int(qdir.name) < QUEUE_COUNT_MAX and _has_entries(qdir):
                    self.queue_for(topic_dir.name, int(qdir.name))

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, if its topic has it (UnknownTopic, UnknownQueue otherwise)."""
        count = self._topics.queue_count(topic)
        if not 0 <= queue_id < count:
            raise UnknownQueue(topic, queue_id, count)
        return self.queue_for(topic, queue_id)

    def queue_for(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, opened (its directory made) if it is not yet; the caller checked the topic."""
        cq = self.by_key.get((topic, queue_id))
        if cq is None:
            with self.lock:
                cq = self.by_key.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(self._paths.queue_dir(topic, queue_id), self._entries_per_file)
                    self.by_key[(topic, queue_id)] = cq
        return cq

    def keys(self) -> list[QueueKey]:
        """The queues opened: those that held entries at load, and any used since (a queue not
        among them holds no entry)."""
        with self.lock:
            return list(self.by_key)

    def snapshot(self) -> dict[QueueKey, ConsumeQueue]:
        with self.lock:
            return dict(self.by_key)

    def remove(self, counts: dict[str, int]) -> list[ConsumeQueue]:
        """Forget the queues of deleted topics (name: queue count); their files are the caller's."""
        with self.lock:
            return [cq for name, count in counts.items() for queue_id in range(count)
                    if (cq := self.by_key.pop((name, queue_id), None)) is not None]

    def holds(self, queue_id: int, offset: int, topic: str, phys: int) -> bool:
        """The queue ``topic/queue_id`` holds the record at ``phys`` at ``offset``."""
        try:
            cq = self.queue(topic, queue_id)
            return cq.min_offset <= offset < cq.max_offset and int(cq.read(offset, 1)["phys"][0]) == phys
        except (StoreError, OffsetExpired, ValueError):
            return False

    def save_min_offsets(self) -> None:
        """Persist every queue's minimum (moved by retention or a restart)."""
        with self.lock:
            minimums = {key: cq.min_offset for key, cq in self.by_key.items()}
        save_min_offsets(self._paths.min_offsets, minimums)

    def close(self, queues: Iterable[ConsumeQueue] | None = None) -> None:
        for cq in self.by_key.values() if queues is None else queues:
            cq.close()

    def group_by_queue(self, parsed: ParsedRecords, queue_ids: np.ndarray) -> list[QueueGroup]:
        """Split a batch by (topic, queue); unknown topics and queue ids raise here."""
        topics, queue_for = parsed.topics, self.queue_for
        if len(topics) == 1:  # the usual batch, one queue of one topic: few or no numpy calls
            first = int(queue_ids[0])
            if (0 <= first < self._topics.queue_count(topics[0])
                    and (len(queue_ids) == 1 or bool((queue_ids == first).all()))):
                key = (topics[0], first)
                return [QueueGroup(queue_for(*key), slice(None), key)]
        counts = np.array([self._topics.queue_count(t) for t in topics], np.int64)
        per_record = counts[parsed.topic_index]
        bad = np.flatnonzero((queue_ids < 0) | (queue_ids >= per_record))
        if bad.size:
            i = int(bad[0])
            raise UnknownQueue(topics[parsed.topic_index[i]], int(queue_ids[i]), int(per_record[i]))
        keys = parsed.topic_index * QUEUE_COUNT_MAX + queue_ids
        if (keys == keys[0]).all():
            key = (topics[parsed.topic_index[0]], int(queue_ids[0]))
            return [QueueGroup(queue_for(*key), slice(None), key)]
        starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
        firsts = [0, *starts.tolist()]
        run_keys = keys[firsts].tolist()
        if len(set(run_keys)) == len(run_keys):  # each queue's records in a row (a producer's batches): slices
            ends = [*firsts[1:], len(keys)]
            run_topics = [topics[t] for t in parsed.topic_index[firsts].tolist()]
            return [QueueGroup(queue_for(topic, queue_id), slice(first, end), (topic, queue_id))
                    for topic, queue_id, first, end in zip(run_topics, queue_ids[firsts].tolist(), firsts, ends,
                                                           strict=True)]
        order = np.argsort(keys, kind="stable")
        bounds = np.flatnonzero(np.diff(keys[order])) + 1
        groups = []
        for idx in np.split(order, bounds):
            first = int(idx[0])
            key = (topics[parsed.topic_index[first]], int(queue_ids[first]))
            groups.append(QueueGroup(queue_for(*key), idx, key))
        return groups


def _has_entries(queue_dir: Path) -> bool:
    """Whether a queue's index directory holds anything (made empty with its topic otherwise)."""
    with os.scandir(queue_dir) as entries:
        return next(entries, None) is not None
