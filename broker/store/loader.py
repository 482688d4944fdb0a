"""Opening a store: its parts loaded from their files and recovered to agree with the commitlog
(as Kafka's ``LogLoader``), then handed to the :class:`MessageStore` that serves them.

After a crash (an abort marker, no checkpoint, or one that does not match the commitlog's end)
the commitlog is re-read from the last checkpoint's safe offset -- from further back when derived
state was found damaged -- and every record found is told to the index dispatchers, as a live
append is; records whose queue offsets do not continue their queue are reconciled, and an index
that misses entries before where recovery starts is rebuilt from the oldest commitlog file.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.commitlog.recovery import recover
from gms.broker.commitlog.warmer import Warmer
from gms.broker.consumequeue.consume_queue import CQ_DTYPE, ConsumeQueue
from gms.broker.consumequeue.min_offsets import load_min_offsets
from gms.broker.keyindex import KeyIndex
from gms.broker.store.checkpoint import AbortMarker, Checkpoint, read_checkpoint
from gms.broker.store.damage import DamageTracker
from gms.broker.store.dispatch import Appended, Dispatchers, dispatchers
from gms.broker.store.layout import check_layout
from gms.broker.store.origins import OriginMap
from gms.broker.store.paths import StorePaths
from gms.broker.store.producer_state import ProducerStates
from gms.broker.store.queues import QueueGroup, QueueKey, QueueTable, group_counts
from gms.broker.store.topic_table import TopicTable
from gms.broker.store.truncation_log import TruncationLog
from gms.broker.store.types import LOST_ENTRY_SIZE
from gms.broker.store_config import StoreConfig
from gms.private_files import is_private_dir, make_private_dir, tighten_tree
from gms.record import OFF_QUEUE_OFFSET, RecordCheck, check_record
from gms.record.batch import ParsedRecords

log = logging.getLogger(__name__)

GAP_RECORDS_MAX = 1024  # a queue offset further ahead than this is a flipped bit, not lost records
_I64 = struct.Struct(">q")


class LoadedStore(NamedTuple):
    """A store's parts, recovered: what :class:`MessageStore` is constructed from."""

    paths: StorePaths
    config: StoreConfig
    topics: TopicTable
    truncations: TruncationLog
    abort: AbortMarker
    commitlog: CommitLog
    keys: KeyIndex
    queues: QueueTable
    origins: OriginMap
    producers: ProducerStates
    damage: DamageTracker
    dispatchers: Dispatchers
    last_store_ts_ms: int
    checkpointed_offset: int  # cq_safe_offset of the last checkpoint: crash recovery would start there
    recovered_from_crash: bool
    recovered_damaged: int  # damaged stretches the recovery found


class _IndexGap(Exception):
    """Recovery found records whose queue offsets do not continue their index."""


class StoreLoader:
    """Loads the store under ``root``: :meth:`load`, once."""

    def __init__(self, root: Path, config: StoreConfig) -> None:
        self.paths = paths = StorePaths(root)
        self.config = config
        # Messages, offsets and replication state are the owner's only: files 0600 in 0700
        # directories. A store written by an older version is tightened, with a warning; its
        # directory last, so a private one was walked before and is not again (a walk stats every
        # file: ~0.7 s of a restart at 10,000 queues).
        if not is_private_dir(root):
            tighten_tree(root)
        make_private_dir(root)
        check_layout(paths.layout, config)
        self.topics = TopicTable(paths.topics)
        self.topics.load()
        self.truncations = TruncationLog(paths.truncations)
        self.truncations.load()
        self.commitlog = CommitLog(paths.commitlog, config.commitlog_file_size_bytes,
                                   Warmer() if config.warm_next_file else None)
        self.keys = KeyIndex.open(paths.key_index, slot_count=config.key_index_slots,
                                  entries_per_file=config.key_index_entries_per_file)
        self.queues = QueueTable(paths, self.topics, config.cq_entries_per_file)
        self.queues.load()
        # Where the records this store replicated lay on their leaders (message ids on any replica).
        self.origins = OriginMap(paths.origins, config.commitlog_file_size_bytes)
        # Idempotent producers' last batches: as of the last checkpoint, then what recovery re-reads.
        self.producers = ProducerStates(paths.producers, config.producer_state_expiry_ms)
        self.damage = DamageTracker(self.commitlog, self.queues)
        self.dispatchers = dispatchers(self.keys, self.producers, self.origins)
        self.last_store_ts_ms = 0
        self._rebuilding_all = False  # recovery from the oldest file: queues may start late

    def load(self) -> LoadedStore:
        """Recover what the last run did not close cleanly; set the abort marker (this run's)."""
        commitlog, abort = self.commitlog, AbortMarker(self.paths.abort)
        had_data = commitlog.had_data
        producers_whole = self.producers.load()
        checkpoint = read_checkpoint(self.paths.checkpoint)
        clean = checkpoint if checkpoint is not None and not abort.found() else None
        if clean is not None and not self._clean_end_ok(clean.commitlog_flushed_offset):
            log.warning("checkpoint does not match the commitlog end; recovering")
            clean = None
        recovered_damaged = 0
        if clean is None or not producers_whole or self.keys.lost_from is not None:
            recovered_damaged = self._recover(self._recovery_start(checkpoint, producers_whole))
        else:
            commitlog.set_end(clean.commitlog_flushed_offset)
            self.last_store_ts_ms = clean.store_ts_ms
        crashed = clean is None and (had_data or abort.found())  # a new store did not crash
        self._restore_minimums()
        self.truncations.prune(commitlog.min_offset)
        abort.set()
        return LoadedStore(
            self.paths, self.config, self.topics, self.truncations, abort, commitlog, self.keys,
            self.queues, self.origins, self.producers, self.damage, self.dispatchers, self.last_store_ts_ms,
            checkpoint.cq_safe_offset if checkpoint else commitlog.min_offset, crashed, recovered_damaged)

    def _recovery_start(self, checkpoint: Checkpoint | None, producers_whole: bool) -> int:
        """Recovery re-reads from the checkpoint; derived state found damaged needs it from further back."""
        commitlog = self.commitlog
        start = checkpoint.cq_safe_offset if checkpoint and producers_whole else commitlog.min_offset
        if self.keys.lost_from is not None:  # damaged key index files were dropped: re-index their records
            start = max(min(start, self.keys.lost_from), commitlog.min_offset)
        return start

    def _clean_end_ok(self, end: int) -> bool:
        files = self.commitlog.files
        if not files[0].base_offset <= end <= files[-1].end_offset:
            return False
        if end == files[-1].end_offset:
            return True
        f = self.commitlog.file_for(end)
        return check_record(f.view, end - f.base_offset, f.size_bytes)[0] is RecordCheck.EMPTY

    def _restore_minimums(self) -> None:
        """Queue minimums: past the entries whose commitlog file expired, and where per-topic
        retention (or a restart) left them."""
        saved_minimums = load_min_offsets(self.paths.min_offsets)
        for topic, queue_id in saved_minimums:  # an empty queue that starts past 0 (its files expired)
            if self.topics.get(topic) is not None:
                self.queues.queue_for(topic, queue_id)
        for key, cq in self.queues.by_key.items():
            cq.delete_below_phys(self.commitlog.min_offset)
            cq.restore_min(saved_minimums.get(key, 0))

    def _recover(self, start: int) -> int:
        """Rebuild the index from ``start``; if an index turns out to miss entries before it (files
        lost), rebuild every index from the oldest commitlog file. Returns the damaged stretches
        found (each noted, if indexed, for a follower to repair)."""
        queues, commitlog = self.queues.by_key, self.commitlog
        for cq in queues.values():
            cq.truncate_to_phys(start)
        self.keys.truncate(start)
        try:
            recovered = recover(commitlog, start, self._dispatch_recovered)
        except _IndexGap as gap:
            log.warning("%s; rebuilding every consumeQueue from the whole commitlog", gap)
            for cq in queues.values():
                cq.reset(0)
            start = commitlog.min_offset
            self.keys.truncate(start)
            self._rebuilding_all = True
            try:
                recovered = recover(commitlog, start, self._dispatch_recovered)
            finally:
                self._rebuilding_all = False
        end = recovered.end
        for cq in queues.values():
            cq.truncate_to_phys(end)
        for phys in recovered.damaged:
            self.damage.note_at(phys)
        log.log(logging.ERROR if recovered.damaged else logging.INFO,
                "recovered commitlog from %d to %d; %d damaged record(s) kept as damaged",
                start, end, len(recovered.damaged))
        return len(recovered.damaged)

    def _dispatch_recovered(self, parsed: ParsedRecords, phys: np.ndarray) -> None:
        """Index records found by recovery (those of one commitlog file), at the offsets they carry."""
        kept = self._indexable(parsed, phys)
        if kept is None:
            return
        parsed, phys, groups = kept
        queue_ids = parsed.headers["queue_id"].astype(np.int64)
        queue_offsets = parsed.headers["queue_offset"].astype(np.int64)
        sizes, tag_hashes = parsed.sizes, parsed.index_tag_hashes
        consistent = []
        for group in groups:
            cq, idx, key = group
            offs = queue_offsets[idx]
            first = int(offs[0])
            continues = len(offs) == 1 or bool((np.diff(offs) == 1).all())
            if self._rebuilding_all and not cq.files and first > cq.max_offset:
                cq.reset(first)  # older entries expired with their commitlog files
            if continues and first != cq.max_offset and not self._rebuilding_all:
                # the index, not the records, is off: rebuild it all
                raise _IndexGap(f"queue {cq.directory}: records carry offset {first}, "
                                f"the index ends at {cq.max_offset}")
            if continues and first == cq.max_offset:
                consistent.append(group)
            else:  # damaged envelopes: never a reason to refuse to start
                self._index_reconciled(cq, key, offs, phys[idx], sizes[idx], tag_hashes[idx])
        counts = group_counts(consistent, len(phys))
        bases = [cq.max_offset for cq, _, _ in consistent]
        for (cq, _, _), count in zip(consistent, counts, strict=True):
            cq.reserve(count)
        f = self.commitlog.file_for(int(phys[0]))  # recovery hands over the records of one file at a time
        in_file = ParsedRecords(phys - f.base_offset, parsed.headers, parsed.topics, parsed.topic_index)
        store_ts_ms = parsed.headers["store_ts_ms"]
        batch = Appended(f.array, in_file, consistent, counts, bases, queue_ids, queue_offsets, phys, sizes, tag_hashes,
                         store_ts_ms, int(np.bitwise_or.reduce(parsed.headers["flags"])), {}, None)
        for dispatcher in self.dispatchers.before_commit:
            dispatcher.dispatch(batch)
        self.last_store_ts_ms = max(self.last_store_ts_ms, int(store_ts_ms.max()))

    def _indexable(self, parsed: ParsedRecords, phys: np.ndarray
                   ) -> tuple[ParsedRecords, np.ndarray, list[QueueGroup]] | None:
        """The records of ``parsed`` (at ``phys``) to index, with their queues: not those of
        deleted topics (or earlier incarnations) or queues, nor those a replica cut off (never
        indexed again). None: none."""
        queue_ids = parsed.headers["queue_id"].astype(np.int64)
        counts = np.array([self.topics.get(t) or 0 for t in parsed.topics], np.int64)
        born = np.array([self.topics.created_at_offset(t) for t in parsed.topics], np.int64)
        known = (queue_ids >= 0) & (queue_ids < counts[parsed.topic_index]) & (phys >= born[parsed.topic_index])
        if not known.all():
            keep = np.flatnonzero(known)
            if not keep.size:
                return None
            parsed, queue_ids, phys = _kept(parsed, keep), queue_ids[keep], phys[keep]
        groups = self.queues.group_by_queue(parsed, queue_ids)
        if self.truncations:
            queue_offsets = parsed.headers["queue_offset"].astype(np.int64)
            cut = np.zeros(len(queue_ids), bool)
            for _, idx, key in groups:
                covered = self.truncations.truncated(*key, queue_offsets[idx], phys[idx])
                if covered is not None:
                    cut[idx] = covered
            if cut.any():
                keep = np.flatnonzero(~cut)
                if not keep.size:
                    return None
                parsed = ParsedRecords(parsed.starts[keep], parsed.headers[keep], parsed.topics,
                                       parsed.topic_index[keep])
                phys = phys[keep]
                groups = self.queues.group_by_queue(parsed, queue_ids[keep])
        return parsed, phys, groups

    def _index_reconciled(self, cq: ConsumeQueue, key: QueueKey, carried: np.ndarray, phys: np.ndarray,
                          sizes: np.ndarray, tag_hashes: np.ndarray) -> None:
        """Index a queue's recovered records whose queue offsets do not continue it (a bit flipped
        in an envelope, or records lost in a damaged stretch): offsets are reconciled, damaged
        envelopes rewritten, missing records answered as damaged. See :func:`reconcile_offsets`."""
        plan = reconcile_offsets(carried, cq.max_offset)
        entries: list[tuple[int, int, int]] = []
        for k, offset in enumerate(plan.offsets.tolist()):
            if offset < 0:
                log.error("%s/%d: record at commitlog offset %d carries queue offset %d, which "
                          "does not fit the queue: not indexed", *key, int(phys[k]), int(carried[k]))
                continue
            lost = offset - (cq.max_offset + len(entries))
            if lost:
                log.error("%s/%d: %d record(s) before offset %d lost in damaged commitlog data: "
                          "answered as damaged", *key, lost, offset)
                entries += [(int(phys[k]), LOST_ENTRY_SIZE, 0)] * lost
            if offset != int(carried[k]):
                log.error("%s/%d: record at commitlog offset %d carried queue offset %d: repaired to %d",
                          *key, int(phys[k]), int(carried[k]), offset)
                f = self.commitlog.file_for(int(phys[k]))
                _I64.pack_into(f.view, int(phys[k]) - f.base_offset + OFF_QUEUE_OFFSET, offset)
            entries.append((int(phys[k]), int(sizes[k]), int(tag_hashes[k])))
        if entries:
            start = cq.max_offset
            cq.reserve(len(entries))
            cq.write(start, np.array(entries, CQ_DTYPE))
            cq.publish(start + len(entries))


class Reconciled(NamedTuple):
    offsets: np.ndarray  # the queue offset each record is indexed at; -1: not indexed


def reconcile_offsets(carried: np.ndarray, expected: int) -> Reconciled:
    """Queue offsets for a queue's records found by recovery, in commitlog order, when the offsets
    they carry do not simply continue the queue from ``expected``. A record is taken at its carried
    offset when that continues the queue; one whose successor continues the queue as if it had had
    the expected offset has a flipped offset (taken at the expected one); one ahead of the queue
    (by at most GAP_RECORDS_MAX) whose successor follows it marks records lost before it; anything
    else (an offset behind the queue: a record that a flipped queue id sent here) is not indexed,
    unless it is the last one, which is taken at the expected offset rather than lost."""
    out = np.full(len(carried), -1, np.int64)
    values = carried.tolist()
    for k, c in enumerate(values):
        nxt = values[k + 1] if k + 1 < len(values) else None
        if c == expected or nxt == expected + 1:
            out[k] = expected
        elif expected < c <= expected + GAP_RECORDS_MAX and nxt in (None, c + 1):
            out[k] = c
        elif nxt is None:
            out[k] = expected
        else:
            continue
        expected = int(out[k]) + 1
    return Reconciled(out)


def _kept(parsed: ParsedRecords, keep: np.ndarray) -> ParsedRecords:
    """The records ``keep`` of ``parsed``, naming only their own topics (a deleted topic's name
    would fail the grouping, which takes every topic named for one to store to)."""
    index = parsed.topic_index[keep]
    used = np.unique(index)
    remap = np.zeros(len(parsed.topics), np.int64)
    remap[used] = np.arange(len(used))
    return ParsedRecords(parsed.starts[keep], parsed.headers[keep], [parsed.topics[i] for i in used], remap[index])
