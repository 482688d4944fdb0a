"""The store's topics: created, updated and deleted (the topic table, their queues' directories,
a deleted topic's index files), on the topic worker where it writes files."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.store.compacted import CompactedLogs
from gms.broker.store.paths import StorePaths
from gms.broker.store.producer_state import ProducerStates
from gms.broker.store.queues import QueueTable
from gms.broker.store.topic_table import TopicLimits, TopicTable
from gms.broker.store.truncation_log import TruncationLog
from gms.broker.store.types import TimerListener
from gms.private_files import make_private_dir

log = logging.getLogger(__name__)


class StoreTopics:
    """Topic administration. Topic creations and the files of deleted topics are handled by one
    worker thread, in the order they were asked for. ``timers()``: the timer listener, told of
    deleted topics."""

    def __init__(self, paths: StorePaths, commitlog: Callable[[], CommitLog], table: TopicTable, queues: QueueTable,
                 producers: ProducerStates, truncations: TruncationLog,
                 locks: tuple[threading.Lock, threading.Lock], timers: Callable[[], TimerListener],
                 compacted: CompactedLogs) -> None:
        self._paths = paths
        self._compacted = compacted
        self._commitlog = commitlog
        self._table = table
        self._queues = queues
        self._producers = producers
        self._truncations = truncations
        self._write_lock, self._index_lock = locks
        self._timers = timers
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="gms-topic-admin")
        self._worker.submit(self._drop_orphan_queues)

    def close(self) -> None:
        """Finish what the worker was handed."""
        self._worker.shutdown(wait=True)

    def create_topic(self, name: str, queue_count: int, limits: TopicLimits | None = None) -> None:
        """A new incarnation of ``name``: records of a deleted earlier one (still in the commitlog)
        are never indexed under it, even by a crash recovery or an index rebuild."""
        self.create_topics({name: (queue_count, limits or TopicLimits())})

    def create_topics(self, topics: Mapping[str, tuple[int, TopicLimits]]) -> None:
        """Create many topics (name: (queue count, limits)) with one save of the topic table;
        they take records once it is on disk. Blocks on that write: off the event loop, call
        :meth:`create_topics_async`."""
        with self._write_lock:  # no record of an earlier incarnation is stored past this
            created_at_offset = self._commitlog().committed_pos
        for name in topics:
            self._drop_leftover_queues(name)
        self._table.create_many(topics, created_at_offset=created_at_offset)
        self._make_queue_dirs({name: range(count) for name, (count, _) in topics.items()})

    def create_topics_async(self, topics: Mapping[str, tuple[int, TopicLimits]]) -> Future[None]:
        """:meth:`create_topics` on the topic worker, after every deletion handed to it before."""
        return self._worker.submit(self.create_topics, topics)

    def update_topic(self, name: str, queue_count: int | None = None, limits: TopicLimits | None = None) -> None:
        """Grow the queue count and/or replace the topic's limits (None: leave as is)."""
        self._table.update(name, queue_count, limits)
        if queue_count is not None:
            self._make_queue_dirs({name: range(queue_count)})

    def update_topic_async(self, name: str, queue_count: int | None = None,
                           limits: TopicLimits | None = None) -> Future[None]:
        """:meth:`update_topic` on the topic worker (it may write the topic table)."""
        return self._worker.submit(self.update_topic, name, queue_count, limits)

    def topic_limits(self, name: str) -> TopicLimits:
        return self._table.limits(name)

    def topics(self) -> dict[str, int]:
        return self._table.snapshot()

    def queue_count(self, name: str) -> int | None:
        return self._table.get(name)

    def delete_topic(self, name: str) -> None:
        self.delete_topics([name]).result()

    def delete_topics(self, names: Iterable[str]) -> Future[None]:
        """Delete topics: from now on they take no record and serve none (call it on the thread
        that appends: O(their queues), no I/O). Their files go on the topic worker: the topic
        table without them first (so a crash never leaves a listed topic missing records), then
        their index files; the future resolves when that is done. UnknownTopic, deleting none,
        if one is not here."""
        with self._write_lock:
            counts = self._table.remove(names)
            queues = self._queues.remove(counts)
            for name in counts:
                self._producers.deleted(name)
        for name in counts:
            self._timers().deleted(name)
        return self._worker.submit(self._remove_topic_files, list(counts), queues)

    def _remove_topic_files(self, names: list[str], queues: list[ConsumeQueue]) -> None:
        with self._index_lock:
            self._queues.close(queues)
        self._table.persist()  # raises on a failure: the files stay, listed until a later write drops them
        with self._write_lock:
            for name in names:
                self._truncations.drop_topic(name)
        for name in names:
            shutil.rmtree(self._paths.consumequeue / name, ignore_errors=True)
            self._compacted.drop_topic(name)
        self._queues.save_min_offsets()  # a topic created again under one of the names starts at 0

    def _make_queue_dirs(self, queues: Mapping[str, Iterable[int]]) -> None:
        """Make the index directories of new queues here (the topic worker), not at their first
        append on the request loop: a directory made and synced there cost ~1 ms per queue, and
        the first sends to a thousand new topics stalled the broker's every request for seconds.
        Their parents are synced by the next checkpoint, before it counts any entry of theirs as
        durable (a directory sync per topic here took seconds for a thousand topics). An empty
        directory is all an empty queue costs (4 KiB). A failure leaves the rest to the first
        append, which makes what is missing."""
        root = self._paths.consumequeue
        changed: set[Path] = set()
        try:
            make_private_dir(root)
            for name, queue_ids in queues.items():
                made = [d for d in (self._paths.queue_dir(name, q) for q in queue_ids) if not d.is_dir()]
                if not made:
                    continue
                topic_dir = made[0].parent
                changed.update((root, topic_dir) if not topic_dir.is_dir() else (topic_dir,))
                for directory in made:
                    make_private_dir(directory)
        except OSError as err:
            log.warning("cannot make the index directories of new queues (%s): their first appends make them", err)
        finally:
            self._queues.dir_syncs.add(changed)

    def _drop_leftover_queues(self, name: str) -> None:
        """Remove the index files of a deleted incarnation of ``name`` that a crash left behind (the
        topic table had dropped it, its files were still being removed): a new one starts empty."""
        leftover = self._paths.consumequeue / name
        if self._table.get(name) is None and leftover.exists():
            log.warning("topic %s: removing the index files a deleted topic of this name left", name)
            shutil.rmtree(leftover, ignore_errors=True)
        if self._table.get(name) is None:
            self._compacted.drop_topic(name)

    def _drop_orphan_queues(self) -> None:
        """Remove the index files of every topic the table does not list (see above)."""
        try:
            names = [d.name for d in self._paths.consumequeue.iterdir()]
        except FileNotFoundError:
            return
        for name in names:
            self._drop_leftover_queues(name)
