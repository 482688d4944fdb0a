"""The leader's side of replication on the wire: REPLICA_FETCH and OFFSET_FOR_LEADER_EPOCH.

REPLICA_FETCH (200), one request for every queue a follower follows from this broker:
  request fields: {"replica": follower broker id, "wait_ms": long-poll bound when nothing is new,
                   "bytes_max": response body bound,
                   "offsets_session": the leader's offset-store session the seqs below refer
                   to (0 or absent: none),
                   "queues": [[topic, queue_id, fetch_offset, leader_epoch, last_epoch,
                               offsets_seq], ...],
                   "repair": [[topic, queue_id, leader_epoch, [offset, ...]], ...] (optional)}
    fetch_offset is the follower's log end offset (it has every offset below it);
    leader_epoch the epoch it believes the leader has; last_epoch the newest epoch in its own
    history (the leader sends the newer entries of its history that the records cover);
    offsets_seq the last consumer-group commit of the queue it copied (optional, default 0).
    repair: records the follower holds damaged (a bit flipped on its disk; found by its
    recovery or a read) and asks again, below its fetch offset (optional; see "repaired").
  response fields: {"offsets_session": int, "offsets_seq": int,
                    "queues": [[topic, queue_id, status, hw, leo, size, epochs, offsets, crc,
                                sizes, log_start, damaged], ...],
                    "repaired": [[topic, queue_id, status, [[offset, size, crc], ...]], ...]}
    status 0 or a wire Status: NOT_LEADER, FENCED_LEADER_EPOCH (the two epochs differ: whoever
    is behind must learn the new metadata first), OFFSET_ILLEGAL (fetch offset beyond the
    leader's end: truncate first). size = bytes of this queue's records in the body, which
    holds every queue's records back to back in the order of "queues", as stored.
    offsets = [[group, committed offset], ...] of the groups that committed on the queue after
    the follower's offsets_seq (all of them if the session is not the leader's; offset -1: the
    group's offset was deleted, see broker/offsets.py); the follower stores them and next sends
    offsets_session/offsets_seq of this response. crc = zlib.crc32 of the queue's records in
    the body: the follower checks that one CRC instead of every record's (the leader checked
    those when it accepted the records). sizes = the records'
    sizes (bytes, big-endian int32 each, from the leader's consumeQueue; optional): the
    follower finds record starts with one cumsum instead of a walk over the records, and
    checks them against each record's own total_size. log_start = the leader's minimum offset of
    the queue (retention moves it; optional): a follower whose fetch offset is below it missed
    records that expired on the leader and starts its queue over there (Kafka's log start offset).
    damaged = the queue offsets of the answered range that the leader holds damaged (a record
    whose CRC fails, or a lost entry: see MessageStore.read_runs) as [[first, count], ...] runs
    of consecutive offsets, in offset order (optional; a damaged stretch of the commitlog is one
    run, however many entries it cost): they are not in the body (nor in size, crc, sizes); the
    answered range is the records and these together, from fetch_offset on. The follower
    indexes them as damaged (lost entries, so its queue offsets stay the leader's) and never
    stores the damaged bytes as data.
    repaired: one row per "repair" row, status as for "queues"; each asked offset with the size
    of the leader's record and zlib.crc32 of its bytes, size 0 when the leader has no intact
    copy (damaged too, or outside its queue). The records follow the queues' records in the
    body, in that order. The follower checks them (crc, its own record's size, the record's
    CRC) and rewrites its damaged copy in place (MessageStore.repair_record).
OFFSET_FOR_LEADER_EPOCH (202):
  request {"queues": [[topic, queue_id, leader_epoch, epoch], ...]}
  response {"queues": [[topic, queue_id, status, epoch, end_offset], ...]}: the largest epoch
    <= the one asked that the leader knows, and the offset where it ends on the leader.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from isal.isal_zlib import crc32  # zlib's CRC-32 values, several times faster

from gms.broker.ha.fetcher import SIZES_DTYPE, offset_runs
from gms.broker.ha.partition import Partition, Role
from gms.broker.ha.replica_manager import ReplicaManager
from gms.broker.store import GetStatus
from gms.errors import BadRequestError
from gms.protocol.codes import Status
from gms.protocol.fields import INT32, INT64, Columns, checked_int, field, topic_row
from gms.protocol.frame import Frame, Response

FETCH_MSGS_MAX = 65_536  # per queue per response
FETCH_WAIT_MS_MAX = 30_000
FETCH_BYTES_MAX = 32 << 20
REPAIR_BYTES_MAX = 4 << 20  # records one response sends for repairs (at least one)
REPAIR_RECORDS_MAX = 1024  # offsets one request may ask to repair


class Wanted(NamedTuple):
    """One queue of a REPLICA_FETCH request."""

    topic: str
    queue_id: int
    fetch_offset: int
    leader_epoch: int
    last_epoch: int
    offsets_seq: int  # 0 unless it refers to this broker's offset-store session


# The integer columns of the request rows (after the topic).
_FETCH_COLUMNS: Columns = (("queue_id", INT32), ("fetch_offset", INT64), ("leader_epoch", INT64),
                           ("last_epoch", INT64), ("offsets_seq", INT64))
_EPOCH_COLUMNS: Columns = (("queue_id", INT32), ("leader_epoch", INT64), ("epoch", INT64))
_REPAIR_COLUMNS: Columns = (("queue_id", INT32), ("leader_epoch", INT64))


def _wanted(row: Any, same_session: bool) -> Wanted:
    """One REPLICA_FETCH queue row; ``offsets_seq`` (optional) counts only in the same offsets session."""
    topic, queue_id, offset, epoch, last, *rest = topic_row("queues", row, _FETCH_COLUMNS, optional=1)
    return Wanted(topic, queue_id, offset, epoch, last, rest[0] if rest and same_session else 0)


class LeaderHandlers:
    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager
        self.store = manager.store

    def _check(self, topic: str, queue_id: int, leader_epoch: int) -> tuple[Partition | None, int]:
        p = self.manager.partitions.get((topic, queue_id))
        if p is None or p.role is not Role.LEADER:
            return p, Status.NOT_LEADER
        if leader_epoch != p.leader_epoch:
            return p, Status.FENCED_LEADER_EPOCH
        return p, Status.SUCCESS

    async def replica_fetch(self, request: Frame) -> Response:
        fields = request.fields
        replica = field(fields, "replica", str)
        wait_ms = min(max(field(fields, "wait_ms", int, 0), 0), FETCH_WAIT_MS_MAX)
        bytes_max = min(max(field(fields, "bytes_max", int, FETCH_BYTES_MAX), 1), FETCH_BYTES_MAX)
        queues = field(fields, "queues", list)
        offsets = self.manager.offsets
        same_session = field(fields, "offsets_session", int, 0) == offsets.session
        wanted = [_wanted(row, same_session) for row in queues]
        repair = field(fields, "repair", list, [])
        self._record_progress(replica, wanted)
        rows, body, news = self._read(wanted, bytes_max)
        if wait_ms and not news and not repair:
            keys = [(w.topic, w.queue_id) for w in wanted]
            await self.manager.wait_for_data(keys, wait_ms / 1000)
            rows, body, news = self._read(wanted, bytes_max)
        answer: dict[str, Any] = {"queues": rows, "offsets_session": offsets.session, "offsets_seq": offsets.seq}
        if repair:
            answer["repaired"], records = self._read_repairs(repair)
            body.extend(records)
        return Response(answer, body=body)

    def _read_repairs(self, repair: list[Any]) -> tuple[list[list[Any]], list[memoryview]]:
        """Rows and records of a response's "repaired" field: the intact records asked for."""
        rows: list[list[Any]] = []
        records: list[memoryview] = []
        budget, asked = REPAIR_BYTES_MAX, 0
        for row in repair:
            if not isinstance(row, list) or len(row) != 4 or not isinstance(row[3], list):
                raise BadRequestError("request field 'repair' must hold rows of [topic, queue_id, leader_epoch,"
                                      " [offset, ...]]")
            topic, queue_id, epoch = topic_row("repair", row[:3], _REPAIR_COLUMNS)
            offsets = [checked_int("repair: offset", o, INT64) for o in row[3]]
            _, status = self._check(topic, queue_id, epoch)
            if status:
                rows.append([topic, queue_id, int(status), []])
                continue
            found: list[list[int]] = []
            for offset in offsets:
                asked += 1
                if asked > REPAIR_RECORDS_MAX or budget <= 0:
                    break
                view = self._intact_record(topic, queue_id, offset)
                if view is None:
                    found.append([offset, 0, 0])
                    continue
                records.append(view)
                budget -= len(view)
                found.append([offset, len(view), crc32(view)])
            rows.append([topic, queue_id, 0, found])
        return rows, records

    def _intact_record(self, topic: str, queue_id: int, offset: int) -> memoryview | None:
        """The record at ``offset`` if this broker holds it intact (its CRC holds)."""
        if not self.store.min_offset(topic, queue_id) <= offset < self.store.max_offset(topic, queue_id):
            return None
        got = self.store.get(topic, queue_id, offset, 1)
        if got.status is not GetStatus.FOUND or got.damaged or len(got.records) != 1:
            return None
        return got.records[0]

    def _record_progress(self, replica: str, wanted: list[Wanted]) -> None:
        now = time.monotonic()
        for topic, queue_id, offset, epoch, *_ in wanted:
            p, status = self._check(topic, queue_id, epoch)
            if status or p is None or replica not in p.replicas:
                continue
            leo = self.store.max_offset(topic, queue_id)
            if offset <= leo:
                p.record_fetch(replica, offset, leo, now)
                self.manager.after_fetch(p, leo)

    def _read(self, wanted: list[Wanted], bytes_max: int) -> tuple[list[list[Any]], list[memoryview], bool]:
        """Rows and body of a response, and whether it holds anything new (records, commits)."""
        rows: list[list[Any]] = []
        body: list[memoryview] = []
        budget = bytes_max
        news = False
        for topic, queue_id, offset, epoch, last_epoch, offsets_seq in wanted:
            p, status = self._check(topic, queue_id, epoch)
            if status or p is None:
                rows.append([topic, queue_id, int(status), 0, 0, 0, [], [], 0, b""])
                continue
            leo = self.store.max_offset(topic, queue_id)
            if offset > leo:
                rows.append([topic, queue_id, int(Status.OFFSET_ILLEGAL), p.hw, leo, 0, [], [], 0, b""])
                continue
            size, next_offset, crc, sizes, damaged = 0, offset, 0, b"", []
            if offset < leo and budget > 0:
                read = self.store.read_runs(topic, queue_id, offset, FETCH_MSGS_MAX, budget)
                next_offset, size = read.next_offset, read.size
                body.extend(read.views)
                budget -= size
                for view in read.views:
                    crc = crc32(view, crc)
                sizes = read.sizes.astype(SIZES_DTYPE).tobytes()
                damaged = offset_runs(read.damaged)
            epochs = [[e.epoch, e.start_offset] for e in p.history.entries
                      if e.epoch > last_epoch and e.start_offset < next_offset]
            commits = self.manager.offsets.changed_since(topic, queue_id, offsets_seq)
            news = news or bool(size or damaged or commits)
            row = [topic, queue_id, 0, p.hw, leo, size, epochs, commits, crc, sizes,
                   self.store.min_offset(topic, queue_id)]
            rows.append([*row, damaged] if damaged else row)
        return rows, body, news

    async def offset_for_leader_epoch(self, request: Frame) -> Response:
        queues = field(request.fields, "queues", list)
        rows: list[list[Any]] = []
        for row in queues:
            topic, queue_id, leader_epoch, epoch = topic_row("queues", row, _EPOCH_COLUMNS)
            p, status = self._check(topic, queue_id, leader_epoch)
            if status or p is None:
                rows.append([topic, queue_id, int(status), -1, 0])
                continue
            found = p.history.end_for(epoch, self.store.max_offset(topic, queue_id))
            rows.append([topic, queue_id, 0, found.epoch, found.end_offset])
        return Response({"queues": rows})
