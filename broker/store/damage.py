"""Damaged records: found by CRC (a read) or by recovery, listed per queue for a follower to ask
its leader's intact copies of, and rewritten in place from such a copy."""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable

import numpy as np

from gms.broker.commitlog.commitlog import CommitLog
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.store.queues import QueueKey, QueueTable
from gms.broker.store.records import FileRuns, file_runs
from gms.broker.store.types import LOST_ENTRY_SIZE, RepairOutcome
from gms.record import MAGIC_V1, OFF_QUEUE_ID, check_stored
from gms.record.batch import parse_batch, parse_records
from gms.store_errors import InvalidRecord, StoreError, StoreIOError

log = logging.getLogger(__name__)

_STORED_HEAD = np.dtype([("total_size", ">i4"), ("magic", ">u4"), ("crc32", ">u4"), ("queue_id", ">i4"),
                         ("queue_offset", ">i8"), ("phys_offset", ">i8")])  # the bytes outside the CRC but one
_HEAD_STRUCT = struct.Struct(">iI")
_ENVELOPE_HEAD_STRUCT = struct.Struct(">iqq")


def check_stored_records(runs: FileRuns, phys: np.ndarray, sizes: np.ndarray, offsets: np.ndarray,
                         queue_id: int) -> np.ndarray:
    """Indexes of the records at ``phys`` (in the file ``runs``) whose CRC fails, and of the
    entries for records recovery found lost. Length, magic and envelope lie outside the CRC: a
    bit flipped there would hand consumers an undecodable record or a wrong position. The
    consumeQueue entry that led here knows them all; any that disagree in a record whose CRC
    holds are rewritten."""
    damaged = []
    for f, lo, hi in runs:
        check = check_stored(f.view, phys[lo:hi] - f.base_offset, sizes[lo:hi], f.base_offset, queue_id,
                             offsets[lo:hi])
        damaged.append(check.damaged + lo)
        for i in (check.misplaced + lo).tolist():
            pos = int(phys[i]) - f.base_offset
            log.error("record at commitlog offset %d had a damaged header %s: repaired from its index entry",
                      int(phys[i]), np.frombuffer(f.view, _STORED_HEAD, 1, pos)[0])
            _HEAD_STRUCT.pack_into(f.view, pos, int(sizes[i]), MAGIC_V1)
            _ENVELOPE_HEAD_STRUCT.pack_into(f.view, pos + OFF_QUEUE_ID, queue_id, int(offsets[i]), int(phys[i]))
    return damaged[0] if len(damaged) == 1 else np.concatenate(damaged) if damaged else np.empty(0, np.intp)


class DamageTracker:
    """Queue offsets of records found damaged (by recovery or a read), for a follower to ask its
    leader's copy of (lost entries are not listed: nothing can repair them in place)."""

    def __init__(self, commitlog: CommitLog, queues: QueueTable) -> None:
        self._commitlog = commitlog
        self._queues = queues
        self._found: dict[QueueKey, set[int]] = {}
        self._lock = threading.Lock()

    def note(self, topic: str, queue_id: int, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Records of a queue found damaged (entries of LOST_ENTRY_SIZE are lost ones: not noted)."""
        found = offsets[sizes != LOST_ENTRY_SIZE].tolist()
        if found:
            with self._lock:
                self._found.setdefault((topic, queue_id), set()).update(found)

    def note_at(self, phys: int) -> None:
        """Note the damaged record recovery indexed at ``phys`` (if its envelope says where)."""
        try:
            f = self._commitlog.file_for(phys)
            parsed = parse_records(f.array, [phys - f.base_offset])
            topic, header = parsed.topics[0], parsed.headers[0]
            offset = int(header["queue_offset"])
            if self._queues.holds(int(header["queue_id"]), offset, topic, phys):
                self.note(topic, int(header["queue_id"]), np.array([offset]), np.array([0]))
        except (StoreError, ValueError, UnicodeDecodeError):
            pass  # not indexed, or its header is unreadable: a read notes what it finds

    def damaged_records(self, topic: str, queue_id: int) -> list[int]:
        """Queue offsets of records found damaged here (by recovery or a read), ascending: what a
        follower asks its leader's intact copies of. Lost entries are not listed."""
        with self._lock:
            return sorted(self._found.get((topic, queue_id), ()))

    def forget_damaged(self, topic: str, queue_id: int, offsets: list[int]) -> None:
        """Stop listing these offsets (no intact copy can be had): they stay damaged."""
        with self._lock:
            self._found.get((topic, queue_id), set()).difference_update(offsets)

    def truncated(self, key: QueueKey, offset: int) -> None:
        """A queue was cut back to ``offset``: records found damaged past the cut are gone."""
        with self._lock:
            found = self._found.get(key, set())
            found.difference_update([o for o in found if o >= offset])


def repair(commitlog: CommitLog, cq: ConsumeQueue, key: QueueKey, offset: int, buf: memoryview,
           body_size_max: int, fail: Callable[[StoreIOError], None]) -> RepairOutcome:
    """Rewrite the damaged copy of ``key@offset`` from an intact ``buf`` (under the write lock;
    see :meth:`MessageStore.repair_record`). ``fail``: what a failed sync makes of the store."""
    topic, queue_id = key
    if not cq.min_offset <= offset < cq.max_offset:
        raise InvalidRecord("offset", f"{topic}/{queue_id}@{offset} is outside the queue "
                                      f"[{cq.min_offset}, {cq.max_offset})")
    entry = cq.read(offset, 1)[0]
    phys, size = int(entry["phys"]), int(entry["size"])
    if size == LOST_ENTRY_SIZE:
        raise InvalidRecord("offset", f"{topic}/{queue_id}@{offset} is a lost entry: no room in the "
                                      "commitlog to rewrite it")
    if len(buf) != size:
        raise InvalidRecord("record", f"{len(buf)} bytes; {topic}/{queue_id}@{offset} has {size}")
    parsed = parse_batch(buf, body_size_max)
    copy_hash = int(parsed.index_tag_hashes[0])
    damaged = bool(check_stored_records(file_runs(commitlog, np.array([phys])), np.array([phys]),
                                        np.array([size]), np.array([offset]), queue_id).size)
    if parsed.topics != [topic] or (copy_hash != int(entry["tag_hash"]) and not damaged):
        raise InvalidRecord("record", f"not {topic}/{queue_id}@{offset} (topic {parsed.topics[0]}, "
                                      f"tag hash {copy_hash})")
    if not damaged:
        return RepairOutcome.INTACT
    f = commitlog.file_for(phys)
    pos = phys - f.base_offset
    f.array[pos: pos + size] = np.frombuffer(buf, np.uint8)
    _ENVELOPE_HEAD_STRUCT.pack_into(f.view, pos + OFF_QUEUE_ID, queue_id, offset, phys)
    try:
        if copy_hash != int(entry["tag_hash"]):  # the flip was in the tag hash recovery indexed
            cq.set_tag_hash(offset, copy_hash)
        f.flush()  # the flush thread only syncs what is new
    except StoreIOError as err:
        fail(err)
        raise
    log.warning("%s/%d@%d: damaged record at commitlog offset %d rewritten from an intact copy",
                topic, queue_id, offset, phys)
    return RepairOutcome.REPAIRED
