"""Followers: one fetcher per leader broker, one connection, every followed queue in each
REPLICA_FETCH, long-polling at the leader while caught up.

Records are appended with the leader's queue offsets (``MessageStore.append_replicated``), so
queue offsets agree across replicas while commitlog offsets differ. Before its first fetch in a
new leader epoch a queue is truncated where its history diverges from the leader's
(OFFSET_FOR_LEADER_EPOCH, Kafka KIP-101). The follower's fetch offset is its log end offset:
that is how the leader learns what the follower has; with ``fsync_before_ack`` the follower
flushes what it appended before that next fetch, so the leader's HW counts only records on disk.

Damage travels as such, never as data: records the leader holds damaged come as runs of queue
offsets beside the records, and the follower indexes them as damaged (lost entries), keeping its
offsets the leader's. Records damaged in the follower's own copy (a bit flipped on its disk,
found by its recovery or a read: ``MessageStore.damaged_records``) ride along in the next fetch
as a "repair" list: the leader sends its copies of those it holds intact, and the follower
rewrites its own in place (``MessageStore.repair_record``); the others stay damaged, logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from isal.isal_zlib import crc32

from gms.broker.ha.compacted_copy import NO_POINT, CompactedCopier
from gms.broker.ha.epochs import UNDEFINED_EPOCH
from gms.broker.ha.partition import Partition, Role
from gms.broker.store import RepairOutcome
from gms.errors import FencedLeaderEpochError, GmsError, NotLeaderError, UnknownCodeError
from gms.net import Connection
from gms.protocol.codes import RequestCode, Status
from gms.protocol.replication import EpochAnswer, EpochQuery, FetchedRange, FetchWant, RepairedQueue, RepairWant
from gms.protocol.rows import decode_rows, encode
from gms.store_errors import CorruptRecord, StoreError, StoreIOError, StoreReadOnly

if TYPE_CHECKING:
    from gms.broker.ha.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.2  # after a connection error or a refusal by the leader
REPAIR_OFFSETS_MAX = 256  # damaged records one fetch asks the leader to send again
REQUEST_TIMEOUT_MS = 10_000  # on top of the fetch's long-poll wait


class _Sent(NamedTuple):
    """A queue as one fetch asked for it."""

    p: Partition
    epoch: int  # the leader epoch asked
    offset: int  # the fetch offset
    offsets_seq: int


class FetcherPool:
    """The fetchers of this broker, one per leader address, following the partition table."""

    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager
        self._fetchers: dict[str, LeaderFetcher] = {}

    def rebalance(self) -> None:
        """Start, stop or wake fetchers after the roles or leaders of queues changed."""
        by_leader: dict[str, list[Partition]] = {}
        for p in self.manager.partitions.values():
            if p.role is Role.FOLLOWER and p.leader_address:
                by_leader.setdefault(p.leader_address, []).append(p)
        for address in set(self._fetchers) - set(by_leader):
            self._fetchers.pop(address).stop()
        for address, partitions in by_leader.items():
            fetcher = self._fetchers.get(address)
            if fetcher is None:
                fetcher = self._fetchers[address] = LeaderFetcher(self.manager, address)
            fetcher.follow(partitions)

    async def stop(self) -> None:
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        for fetcher in fetchers:
            fetcher.stop()
        await asyncio.gather(*(f.task for f in fetchers), return_exceptions=True)


class LeaderFetcher:
    def __init__(self, manager: ReplicaManager, address: str) -> None:
        self.manager = manager
        self.store = manager.store
        self.address = address
        self._partitions: list[Partition] = []
        self._wake = asyncio.Event()
        self._conn: Connection | None = None
        self._failing = False  # log a failing leader once, not every retry
        self._offsets_session = 0  # the leader's offset-store session, from its last answer
        self._copier = CompactedCopier(self.store, manager.broker_id)
        self._uncovered: set[tuple[tuple[str, int], int]] = set()  # (queue, first offset) the leader's log misses
        self.task = asyncio.get_running_loop().create_task(self._run())

    def follow(self, partitions: list[Partition]) -> None:
        self._partitions = partitions
        self._wake.set()

    def stop(self) -> None:
        self.task.cancel()
        self._copier.close()
        if self._conn is not None:
            self._conn.close()

    def _mine(self, p: Partition) -> bool:
        return p.role is Role.FOLLOWER and p.leader_address == self.address

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            partitions = [p for p in self._partitions if self._mine(p) and p.fetch_paused_until <= now]
            if not partitions:
                paused = [p.fetch_paused_until for p in self._partitions if self._mine(p)]
                timeout = max(min(paused) - now, 0.01) if paused else None
                try:  # asyncio.timeout: 3.11's wait_for can swallow a cancellation (see client/rebalance.py)
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            try:
                conn = await self._connection()
                truncating = [p for p in partitions if p.needs_truncation]
                if truncating:
                    await self._truncate(conn, truncating)
                ready = [p for p in partitions if not p.needs_truncation and self._mine(p)
                         and p.fetch_paused_until <= time.monotonic()]
                if ready:
                    await self._fetch(conn, ready)
                self._failing = False
            except GmsError as err:
                log.log(logging.DEBUG if self._failing else logging.WARNING,
                        "replica fetch from %s failed: %s; retrying every %s s", self.address, err, RETRY_BACKOFF_S)
                self._failing = True
                self._close()
                await asyncio.sleep(RETRY_BACKOFF_S)

    async def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            host, port = self.address.rsplit(":", 1)
            self._conn = await Connection.open(host.strip("[]"), int(port), security=self.manager.config.security)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _truncate(self, conn: Connection, partitions: list[Partition]) -> None:
        sent = [(p, p.leader_epoch, p.history.latest_epoch) for p in partitions]
        frame = await conn.request(RequestCode.OFFSET_FOR_LEADER_EPOCH, {
            "queues": [encode(EpochQuery(*p.key, epoch, last)) for p, epoch, last in sent]})
        changed = False
        answers = decode_rows(EpochAnswer, frame.fields.get("queues"), "queues")
        for (p, epoch, asked), row in zip(sent, answers, strict=True):
            if not self._mine(p) or p.leader_epoch != epoch:
                continue
            if row.status:
                self._pause(p, row.status)
                continue
            leo = self.store.max_offset(*p.key)
            target = min(row.end_offset, leo)
            if row.epoch != UNDEFINED_EPOCH and row.epoch != asked:
                # The leader does not know our last epoch: cut where *its* largest known
                # epoch ends in our own history too (KIP-279).
                target = min(target, p.history.end_for(row.epoch, leo).end_offset)
            if target < leo:
                log.warning("queue %s/%d: truncating from %d to %d (epoch %d diverges from leader %s)",
                            *p.key, leo, target, asked, self.address)
                self.store.truncate_queue(*p.key, target)
            before = len(p.history.entries)
            p.history.truncate_from(target)
            changed |= len(p.history.entries) != before
            p.hw = min(p.hw, target)
            p.needs_truncation = False
        if changed:
            self.manager.save_state()

    async def _fetch(self, conn: Connection, partitions: list[Partition]) -> None:
        partitions = await self._copy_lacking(conn, partitions)
        if not partitions:
            return
        config = self.manager.config
        session = self._offsets_session
        sent = [_Sent(p, p.leader_epoch, self.store.max_offset(*p.key),
                      p.offsets_seen[1] if p.offsets_seen[0] == session else 0) for p in partitions]
        repairs = self._repairs_to_ask(sent)
        request: dict[str, Any] = {
            "replica": self.manager.broker_id, "wait_ms": 0 if self._copier.pending else config.fetch_wait_ms,
            "bytes_max": config.fetch_bytes_max, "offsets_session": session,
            "queues": [encode(FetchWant(*s.p.key, s.offset, s.epoch, s.p.history.latest_epoch, s.offsets_seq))
                       for s in sent],
        }
        if repairs:
            request["repair"] = [encode(RepairWant(*p.key, epoch, offsets)) for p, epoch, offsets in repairs]
        frame = await conn.request(RequestCode.REPLICA_FETCH, request,
                                   timeout_ms=config.fetch_wait_ms + REQUEST_TIMEOUT_MS)
        self._offsets_session = frame.fields["offsets_session"]
        new_session = self._offsets_session != session
        seen = (self._offsets_session, frame.fields["offsets_seq"])
        body = memoryview(frame.body)
        pos = 0
        history_changed = False
        appended_end = 0  # commitlog end of this fetch's appends
        behind: list[tuple[_Sent, int]] = []  # queues whose fetch offset is below the leader's log start
        rows = decode_rows(FetchedRange, frame.fields.get("queues"), "queues")
        for asked, row in zip(sent, rows, strict=True):
            chunk, pos = body[pos: pos + row.size], pos + row.size
            p = asked.p
            if not self._mine(p) or p.leader_epoch != asked.epoch or p.needs_truncation:
                continue  # the metadata moved on while the fetch was in flight
            if row.status == Status.OFFSET_ILLEGAL:
                p.needs_truncation = True
            elif row.status:
                self._pause(p, row.status)
            elif row.log_start is not None and asked.offset < row.log_start:  # compacted or expired on the leader
                behind.append((asked, row.log_start))
            else:
                appended_end = self._append_fetched(p, asked.offset, row, chunk) or appended_end
                history_changed |= self._follow_leader(p, row, new_session or asked.offsets_seq == 0)
                self._follow_log_start(p, row.log_start)
                p.offsets_seen = seen
        if repairs:
            self._apply_repairs(repairs, decode_rows(RepairedQueue, frame.fields.get("repaired", []), "repaired"),
                                body[pos:])
        if history_changed:
            self.manager.save_state()
        for asked, log_start in behind:
            await self._catch_up(conn, asked, log_start)
        if appended_end and config.fsync_before_ack:  # the next fetch acknowledges these records
            await asyncio.wrap_future(self.store.durable_future(appended_end))
        self.manager.check_caught_up()

    def _follow_log_start(self, p: Partition, log_start: int | None) -> None:
        """Take the leader's first offset where it moved past this queue's (Kafka's DeleteRecords,
        the leader's retention or disk cap), as a Kafka follower takes its leader's log start
        offset, so records deleted at the leader are not served again after a failover. A queue
        of a compacted topic keeps its own: its compacted log covers what lies below."""
        if log_start is None or log_start <= self.store.log_start(*p.key):
            return
        try:
            if not self.store.topic_limits(p.key[0]).compacted:
                self.store.delete_records(*p.key, log_start)
        except StoreError as err:  # the topic went meanwhile
            log.debug("queue %s/%d: leader's first offset %d not taken: %s", *p.key, log_start, err)

    async def _catch_up(self, conn: Connection, asked: _Sent, log_start: int) -> None:
        """A queue whose fetch offset is below the leader's first offset: copy the leader's
        compacted log of it, if it keeps one (the queue then starts at its point), else start
        the queue over at the leader's first offset (what it misses expired there)."""
        p = asked.p
        point = await self._copy(conn, p, asked.epoch, log_start, 0)
        if point != NO_POINT or not self._mine(p) or p.leader_epoch != asked.epoch:
            return
        log.warning("queue %s/%d: fetch offset %d is below leader %s's first offset %d (retention);"
                    " restarting the queue there", *p.key, asked.offset, self.address, log_start)
        self.store.restart_queue(*p.key, log_start)

    async def _copy_lacking(self, conn: Connection, partitions: list[Partition]) -> list[Partition]:
        """The partitions to fetch. A queue of a ``compact`` topic holding nothing below its first
        offset (started over at its leader's point by a version before REPLICA_COMPACTED, or cut
        by the disk cap) copies the leader's compacted log first, if that covers its first
        offset, and is fetched once it is installed: its fetch offset would take it into the ISR
        without it. Not ``compact,delete`` topics: their first offsets expire on each replica."""
        ready = []
        for p in partitions:
            first = self._lacking_from(p)
            if first is not None:
                point = await self._copy(conn, p, p.leader_epoch, first, first)
                if point is None:  # under way (or refused)
                    continue
                if point == NO_POINT:  # the leader's log does not cover it: fetched as it is
                    self._uncovered.add((p.key, first))
            ready.append(p)
        return ready

    def _lacking_from(self, p: Partition) -> int | None:
        """The first offset of ``p``'s queue if it holds nothing below it (see _copy_lacking)."""
        first = self.store.log_start(*p.key)
        own = self.store.compacted_segment(*p.key)
        if first <= (0 if own is None else own.point) or (p.key, first) in self._uncovered:
            return None
        try:
            limits = self.store.topic_limits(p.key[0])
        except StoreError:
            return None
        return first if limits.compacted and not limits.expires else None

    async def _copy(self, conn: Connection, p: Partition, epoch: int, start: int, need: int) -> int | None:
        """``CompactedCopier.copy``; None (the partition paused) when the leader refuses it."""
        try:
            return await self._copier.copy(conn, p, epoch, (start, need), self.manager.config.fetch_bytes_max)
        except (NotLeaderError, FencedLeaderEpochError) as err:  # the copy goes on once the metadata did
            self._pause(p, err.status)
            return None
        except UnknownCodeError:  # a leader of a version before REPLICA_COMPACTED
            return NO_POINT

    def _append_fetched(self, p: Partition, offset: int, row: FetchedRange, chunk: memoryview) -> int:
        """Append a queue's fetched records (and damaged offsets) at ``offset``; the commitlog end
        of the append (0: none: the queue moved on meanwhile, or nothing came)."""
        if self.store.max_offset(*p.key) != offset:
            return 0
        damaged = row.damaged_offsets()
        sizes = row.record_sizes()
        if len(damaged):
            return self.store.append_replicated_run(
                *p.key, offset, chunk, row.crc, np.empty(0, np.int64) if sizes is None else sizes, damaged,
                origin=self.address)
        if row.size:
            return self.store.append_replicated(chunk, row.crc, sizes, origin=self.address).end_phys_offset
        return 0

    def _follow_leader(self, p: Partition, row: FetchedRange, complete: bool) -> bool:
        """Take the leader's epochs, HW and group commits of a queue's row (``complete``: the
        commits name every group the leader has on the queue); whether the epoch history changed."""
        leo = self.store.max_offset(*p.key)
        history_changed = False
        for entry in row.epochs:
            if entry.start_offset < leo:
                history_changed |= p.history.assign(entry.epoch, entry.start_offset)
        if min(row.hw, leo) > p.hw:
            p.hw = min(row.hw, leo)
            self.manager.hw_moved()
        p.caught_up = p.caught_up or leo >= row.hw
        self.manager.offsets.apply_replicated(*p.key, row.commits, complete=complete)
        return history_changed

    def _repairs_to_ask(self, sent: list[_Sent]) -> list[tuple[Partition, int, list[int]]]:
        """(partition, leader epoch, offsets) of the damaged records this replica holds below its
        fetch offset, to ask the leader for along with this fetch (at most REPAIR_OFFSETS_MAX)."""
        repairs = []
        room = REPAIR_OFFSETS_MAX
        for p, epoch, offset, _ in sent:
            if room <= 0:
                break
            damaged = [o for o in self.store.damaged_records(*p.key) if o < offset][:room]
            if damaged:
                repairs.append((p, epoch, damaged))
                room -= len(damaged)
        return repairs

    def _apply_repairs(self, asked: list[tuple[Partition, int, list[int]]], rows: list[RepairedQueue],
                       body: memoryview) -> None:
        """Rewrite this replica's damaged records with the leader's intact copies; forget those the
        leader cannot supply (damaged there too, expired, or of another size: they stay damaged)."""
        if len(rows) != len(asked):  # a leader that does not know "repair": ask again after an upgrade
            return
        pos = 0
        for (p, epoch, _), row in zip(asked, rows, strict=True):
            records = []
            for found in row.records:
                records.append((found.offset, body[pos: pos + found.size], found.crc))
                pos += found.size
            if row.status or not self._mine(p) or p.leader_epoch != epoch or p.needs_truncation:
                continue  # asked again with a later fetch
            gave_up: list[int] = []  # offsets the leader left out (its budget) are asked again
            for offset, view, crc in records:
                if not view:
                    log.error("queue %s/%d: offset %d is damaged here and the leader %s has no intact copy:"
                              " it stays damaged", *p.key, offset, self.address)
                    gave_up.append(offset)
                    continue
                if crc32(view) != crc:  # spoilt on the way: the fetch fails, asked again after a backoff
                    raise CorruptRecord(0, f"repaired record {p.key[0]}/{p.key[1]}@{offset} does not match"
                                           " the leader's CRC")
                try:
                    outcome = self.store.repair_record(*p.key, offset, view)
                except (StoreReadOnly, StoreIOError):
                    raise  # the store stopped taking writes: nothing is given up
                except StoreError as err:  # not that record (size, CRC, topic), a lost entry, expired
                    log.error("queue %s/%d: offset %d is damaged here; the leader's copy cannot repair it (%s):"
                              " it stays damaged", *p.key, offset, err)
                    gave_up.append(offset)
                    continue
                log.info("queue %s/%d: offset %d %s from leader %s", *p.key, offset,
                         "repaired" if outcome is RepairOutcome.REPAIRED else "was intact", self.address)
            if gave_up:
                self.store.forget_damaged(*p.key, gave_up)

    def _pause(self, p: Partition, status: Any) -> None:
        log.info("queue %s/%d: leader %s refused the fetch (%s); waiting for new metadata",
                 *p.key, self.address, Status(status).name)
        p.fetch_paused_until = time.monotonic() + RETRY_BACKOFF_S
