"""Replication, the leader's side: what a follower's REPLICA_FETCH and OFFSET_FOR_LEADER_EPOCH
get (their rows: gms.protocol.replication; what they mean: docs/replication.md).

One fetch asks for every queue a follower follows from this broker. Each queue's answer row says
where the leader is (HW, LEO, log start), the epochs and group commits the follower has not seen,
and how many bytes of the body are its records (up to the fetch's byte bound, the records' CRC
and sizes beside them); records the leader holds damaged travel as runs of offsets, never as
data. A follower that asks to repair records it holds damaged gets the leader's intact copies
after the queues' records. When nothing is new the fetch waits (``wait_ms``) for data.

A queue this broker does not lead, or leads in another epoch than the follower believes, is
refused in its own row (the status of :class:`~gms.errors.NotLeaderError`,
:class:`~gms.errors.FencedLeaderEpochError` or :class:`~gms.errors.OffsetIllegalError`): the
other queues of the fetch are served.

A follower whose fetch offset is below the leader's compaction point of a compacted queue copies
the leader's compacted log of the queue first (REPLICA_COMPACTED, :meth:`ReplicationService.compacted_chunk`:
whole records, a bounded chunk per request; docs/storage-format.md "Compacted topics").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32 values, several times faster

from gms.broker.ha.partition import Partition, Role
from gms.broker.ha.replica_manager import ReplicaManager
from gms.broker.store import GetStatus
from gms.broker.store.records import coalesce
from gms.errors import BadRequestError, FencedLeaderEpochError, GmsError, NotLeaderError, OffsetIllegalError
from gms.protocol.replication import (
    SIZES_DTYPE,
    EpochAnswer,
    EpochEntry,
    EpochQuery,
    FetchedRange,
    FetchWant,
    OffsetRun,
    RepairedQueue,
    RepairedRecord,
    RepairWant,
    offset_runs,
)
from gms.record import crc_mismatches, record_views

log = logging.getLogger(__name__)

FETCH_MSGS_MAX = 65_536  # per queue per response
FETCH_WAIT_MS_MAX = 30_000
FETCH_BYTES_MAX = 32 << 20
REPAIR_BYTES_MAX = 4 << 20  # records one response sends for repairs (at least one)
REPAIR_RECORDS_MAX = 1024  # offsets one request may ask to repair
COMPACTED_CHUNK_BYTES_MAX = 8 << 20  # bytes of a compacted log one REPLICA_COMPACTED answer sends


@dataclass(frozen=True, slots=True)
class ReplicaFetchArgs:
    """A follower's fetch: ``wait_ms`` and ``bytes_max`` are clamped to this broker's bounds;
    ``offsets_session`` names the session of the rows' ``offsets_seq`` (0: none)."""

    replica: str
    queues: Sequence[FetchWant]
    repair: Sequence[RepairWant] = ()
    wait_ms: int = 0
    bytes_max: int = FETCH_BYTES_MAX
    offsets_session: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaFetched:
    """The answer: a row per asked queue, in order; ``body`` holds their records back to back,
    then the repaired records; ``repaired`` (None: none asked) has a row per ``repair`` row.
    ``offsets_session`` and ``offsets_seq``: where the follower's next fetch resumes commits."""

    queues: list[FetchedRange]
    body: list[memoryview]
    offsets_session: int
    offsets_seq: int
    repaired: list[RepairedQueue] | None


@dataclass(frozen=True, slots=True)
class CompactedChunk:
    """A chunk of the leader's compacted log of a queue: whole records from byte ``position`` of
    the log at ``point`` (-1: the leader keeps none) up to ``next_position``; ``size``: the log's
    bytes (the copy is whole when ``next_position`` reaches it). ``body`` leaves out the records
    the leader holds damaged (logged); ``crc``: zlib's CRC-32 of the body."""

    point: int
    position: int
    next_position: int
    size: int
    crc: int
    body: list[memoryview]


class ReplicationService:
    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager
        self.store = manager.store

    def _leading(self, topic: str, queue_id: int, leader_epoch: int) -> Partition:
        """This broker's partition of the queue, led in ``leader_epoch``; NotLeaderError or
        FencedLeaderEpochError otherwise."""
        p = self.manager.partitions.get((topic, queue_id))
        if p is None or p.role is not Role.LEADER:
            raise NotLeaderError(f"this broker does not lead {topic}/{queue_id}")
        if leader_epoch != p.leader_epoch:
            raise FencedLeaderEpochError(f"{topic}/{queue_id} is led in epoch {p.leader_epoch}, not {leader_epoch}")
        return p

    async def fetch(self, args: ReplicaFetchArgs) -> ReplicaFetched:
        wait_ms = min(max(args.wait_ms, 0), FETCH_WAIT_MS_MAX)
        bytes_max = min(max(args.bytes_max, 1), FETCH_BYTES_MAX)
        offsets = self.manager.offsets
        same_session = args.offsets_session == offsets.session
        wanted = [_wanted(row, same_session) for row in args.queues]
        self._record_progress(args.replica, wanted)
        rows, body, news = self._read(wanted, bytes_max)
        if wait_ms and not news and not args.repair:
            keys = [(w.topic, w.queue_id) for w in wanted]
            await self.manager.wait_for_data(keys, wait_ms / 1000)
            rows, body, news = self._read(wanted, bytes_max)
        repaired = None
        if args.repair:
            repaired, records = self._read_repairs(args.repair)
            body.extend(records)
        return ReplicaFetched(rows, body, offsets.session, offsets.seq, repaired)

    def leader_epochs(self, queries: Sequence[EpochQuery]) -> list[EpochAnswer]:
        """Where each queried epoch ends in this leader's history (Kafka KIP-101)."""
        rows: list[EpochAnswer] = []
        for query in queries:
            topic, queue_id = query.topic, query.queue_id
            try:
                p = self._leading(topic, queue_id, query.leader_epoch)
            except GmsError as err:
                rows.append(EpochAnswer(topic, queue_id, int(err.status), -1, 0))
                continue
            found = p.history.end_for(query.epoch, self.store.max_offset(topic, queue_id))
            rows.append(EpochAnswer(topic, queue_id, 0, found.epoch, found.end_offset))
        return rows

    def compacted_chunk(self, topic: str, queue_id: int, leader_epoch: int, point: int, position: int,
                        bytes_max: int) -> CompactedChunk:
        """Records of the queue's compacted log from byte ``position`` if its point is still
        ``point``, else from its start (the log was replaced since: the copy starts over)."""
        self._leading(topic, queue_id, leader_epoch)
        segment = self.store.compacted_segment(topic, queue_id)
        if segment is None:
            return CompactedChunk(-1, 0, 0, 0, 0, [])
        starts, sizes = segment.starts, segment.sizes
        end = int(starts[-1] + sizes[-1]) if len(starts) else 0
        position = position if point == segment.point else 0
        first = int(np.searchsorted(starts, position))
        if position > end or (first < len(starts) and int(starts[first]) != position):
            raise BadRequestError(f"{topic}/{queue_id}: byte {position} is not a record's start in the compacted log")
        budget = min(max(bytes_max, 1), COMPACTED_CHUNK_BYTES_MAX)
        stop = first + max(int(np.searchsorted(np.cumsum(sizes[first:]), budget, side="right")), 1)
        stop = min(stop, len(starts))
        picked_starts, picked_sizes = starts[first:stop], sizes[first:stop]
        next_position = int(starts[stop]) if stop < len(starts) else end  # past a damaged stretch skipped at open
        bad = crc_mismatches(segment.view, picked_starts, picked_sizes) if stop > first else np.empty(0, np.intp)
        if bad.size:
            log.error("%s/%d: %d damaged record(s) of the compacted log left out of a follower's copy",
                      topic, queue_id, bad.size)
            keep = np.ones(len(picked_starts), bool)
            keep[bad] = False
            picked_starts, picked_sizes = picked_starts[keep], picked_sizes[keep]
        body = record_views(segment.view, *coalesce(picked_starts, picked_sizes)) if len(picked_starts) else []
        crc = 0
        for view in body:
            crc = crc32(view, crc)
        return CompactedChunk(segment.point, position, next_position, end, crc, body)

    def _record_progress(self, replica: str, wanted: list[FetchWant]) -> None:
        """A fetch offset is what the follower has: the ISR and the HW move with it."""
        now = time.monotonic()
        for want in wanted:
            try:
                p = self._leading(want.topic, want.queue_id, want.leader_epoch)
            except GmsError:
                continue
            if replica not in p.replicas:
                continue
            leo = self.store.max_offset(want.topic, want.queue_id)
            if want.fetch_offset <= leo:
                p.record_fetch(replica, want.fetch_offset, leo, now)
                self.manager.after_fetch(p, leo)

    def _read(self, wanted: list[FetchWant], bytes_max: int) -> tuple[list[FetchedRange], list[memoryview], bool]:
        """Rows and body of a response, and whether it holds anything new (records, commits)."""
        rows: list[FetchedRange] = []
        body: list[memoryview] = []
        budget = bytes_max
        news = False
        for want in wanted:
            topic, queue_id, offset = want.topic, want.queue_id, want.fetch_offset
            try:
                p = self._leading(topic, queue_id, want.leader_epoch)
            except GmsError as err:
                rows.append(FetchedRange(topic, queue_id, int(err.status), 0, 0, 0, (), (), 0))
                continue
            leo = self.store.max_offset(topic, queue_id)
            if offset > leo:
                rows.append(FetchedRange(topic, queue_id, int(OffsetIllegalError.status), p.hw, leo, 0, (), (), 0))
                continue
            size, next_offset, crc, sizes = 0, offset, 0, b""
            damaged: tuple[OffsetRun, ...] = ()
            if offset < leo and budget > 0:
                read = self.store.read_runs(topic, queue_id, offset, FETCH_MSGS_MAX, budget)
                next_offset, size = read.next_offset, read.size
                body.extend(read.views)
                budget -= size
                for view in read.views:
                    crc = crc32(view, crc)
                sizes = read.sizes.astype(SIZES_DTYPE).tobytes()
                damaged = offset_runs(read.damaged)
            epochs = tuple(EpochEntry(e.epoch, e.start_offset) for e in p.history.entries
                           if e.epoch > want.last_epoch and e.start_offset < next_offset)
            commits = tuple(self.manager.offsets.changed_since(topic, queue_id, want.offsets_seq))
            news = news or bool(size or damaged or commits)
            rows.append(FetchedRange(topic, queue_id, 0, p.hw, leo, size, epochs, commits, crc, sizes,
                                     self.store.log_start(topic, queue_id), damaged))
        return rows, body, news

    def _read_repairs(self, repair: Sequence[RepairWant]) -> tuple[list[RepairedQueue], list[memoryview]]:
        """Rows and records of an answer's "repaired" field: the intact records asked for."""
        rows: list[RepairedQueue] = []
        records: list[memoryview] = []
        budget, asked = REPAIR_BYTES_MAX, 0
        for want in repair:
            try:
                self._leading(want.topic, want.queue_id, want.leader_epoch)
            except GmsError as err:
                rows.append(RepairedQueue(want.topic, want.queue_id, int(err.status), ()))
                continue
            found: list[RepairedRecord] = []
            for offset in want.offsets:
                asked += 1
                if asked > REPAIR_RECORDS_MAX or budget <= 0:
                    break
                view = self._intact_record(want.topic, want.queue_id, offset)
                if view is None:
                    found.append(RepairedRecord(offset, 0, 0))
                    continue
                records.append(view)
                budget -= len(view)
                found.append(RepairedRecord(offset, len(view), crc32(view)))
            rows.append(RepairedQueue(want.topic, want.queue_id, 0, tuple(found)))
        return rows, records

    def _intact_record(self, topic: str, queue_id: int, offset: int) -> memoryview | None:
        """The record at ``offset`` if this broker holds it intact (its CRC holds)."""
        if not self.store.min_offset(topic, queue_id) <= offset < self.store.max_offset(topic, queue_id):
            return None
        got = self.store.get(topic, queue_id, offset, 1)
        if got.status is not GetStatus.FOUND or got.damaged or len(got.records) != 1:
            return None
        return got.records[0]


def _wanted(row: FetchWant, same_session: bool) -> FetchWant:
    """``offsets_seq`` counts only in the same offsets session."""
    return row if same_session or not row.offsets_seq else row._replace(offsets_seq=0)
