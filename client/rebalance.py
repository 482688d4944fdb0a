"""Which queues this consumer reads, kept current by heartbeats to the group's coordinator (runs
on the I/O loop).

The coordinator is found with FIND_COORDINATOR (any broker answers) and found again when it
answers NOT_COORDINATOR or stops answering. HEARTBEAT reports the queues still ``held`` and
returns the assignment over every broker's queues. A queue missing from the assignment is
*revoked*: its fetcher stops at once, but it stays held until the polling thread has committed
its position and released it (:meth:`Membership.release`, then an immediate heartbeat), so the
next owner starts exactly where this one stopped. The coordinator also says how soon to beat
again: sooner while a hand-off in the group is under way.

A member whose heartbeats have failed for a whole member expiry has been expired by the
coordinator, and its queues may have gone to others: it *fences* itself — stops fetching and
drops its queues without committing (they are reported *lost*) — and joins again when a
heartbeat succeeds. Broadcasting: every member reads every queue from its own positions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from gms.client.fetcher import Fetcher, QueueState, TopicQueue, leader_of
from gms.client.local_offsets import LocalOffsetStore
from gms.client.routing import abandon_when, leader_request
from gms.client.runtime import ClientRuntime
from gms.errors import (
    ForbiddenError,
    GmsError,
    NotCoordinatorError,
    QueueHeldError,
    ServiceUnavailableError,
    TopicNotFoundError,
    UnauthenticatedError,
)
from gms.log_throttle import Outage
from gms.protocol.codes import RequestCode
from gms.protocol.fetch import EARLIEST, LATEST
from gms.protocol.frame import Frame
from gms.protocol.groups import QueueOffset, QueueRef
from gms.protocol.rows import encode

log = logging.getLogger(__name__)

StartFrom = str | int  # "last", "first" or a timestamp in ms
NO_COMMITTED_OFFSET = -1
HEARTBEAT_RETRY_MS = 200
# While a heartbeat waits, whether its coordinator is still registered is asked this often.
COORDINATOR_CHECK_INTERVAL_MS = 1000
DEFAULT_MEMBER_EXPIRY_MS = 30_000  # until the coordinator said its own
LEAVE_TIMEOUT_S = 5.0  # close() waits this long at most to say it leaves
TOPIC_LAG_S = 5.0  # a coordinator may learn of a new topic this much after the nameserver
TOPIC_LAG_RETRY_S = 0.1


class RebalanceEvent(NamedTuple):
    """Queues assigned or revoked, for the polling thread (``lost``: revoked without a commit,
    because the member was fenced)."""

    assigned: bool
    queues: list[TopicQueue]
    lost: bool = False


class Membership:
    def __init__(self, runtime: ClientRuntime, fetcher: Fetcher, *, group: str, member: str,
                 clustering: bool, subscription: Mapping[str, str], start_from: StartFrom,
                 heartbeat_interval_ms: float | None, local_offsets: LocalOffsetStore | None) -> None:
        """``local_offsets``: where a broadcasting member keeps its offsets (None: it keeps none)."""
        self._runtime = runtime
        self._fetcher = fetcher
        self._group = group
        self._member = member
        self._clustering = clustering
        self._subscription = dict(subscription)
        self._start_from = start_from
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._local_offsets = local_offsets
        self._interval_s = (heartbeat_interval_ms or 3000) / 1000
        self._member_expiry_s = DEFAULT_MEMBER_EXPIRY_MS / 1000
        self._last_beat_sent: float | None = None  # monotonic time of the last answered heartbeat
        self._fence_timer: asyncio.TimerHandle | None = None
        self._coordinator: str | None = None
        self._beat_outage = Outage(log, f"heartbeat of {group}/{member}")
        self.states: dict[TopicQueue, QueueState] = {}
        self._events: list[RebalanceEvent] = []  # waiting for the polling thread
        self._events_lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._beat_lock: asyncio.Lock | None = None
        # FETCH_OFFSET questions gathered per broker until the loop turns (see _committed).
        self._offset_batches: dict[str, list[tuple[TopicQueue, asyncio.Future[int]]]] = {}
        self._missing: set[str] = set()  # subscribed topics deleted since joining

    # --- called from the polling thread (through runtime.run) or the loop ----------------------

    def take_events(self) -> list[RebalanceEvent]:
        """Assignments and revocations since the last call, in order (for the polling thread)."""
        with self._events_lock:
            events, self._events = self._events, []
        return events

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._beat_lock = asyncio.Lock()
        await self.heartbeat()
        self._task = asyncio.get_running_loop().create_task(self._beat_forever())

    async def release(self, queues: Iterable[TopicQueue]) -> None:
        """Stop holding ``queues`` (positions committed): the leaders end this member's claims,
        and the coordinator hears of it now."""
        released = [q for q in queues if self.states.pop(q, None) is not None]
        try:
            if self._clustering and released:
                await self._send_commits({}, released)
            await self._bounded_heartbeat()
        except (GmsError, TimeoutError) as err:  # the claims lapse by themselves; the next beat tells the coordinator
            log.warning("%s/%s: releasing %s: %r", self._group, self._member, released, err)

    async def commit(self, offsets: Mapping[TopicQueue, int]) -> None:
        if not self._clustering:
            if self._local_offsets is not None:
                self._local_offsets.commit(offsets)
            return
        await self._send_commits(offsets, [])

    async def _send_commits(self, offsets: Mapping[TopicQueue, int], release: Iterable[TopicQueue]) -> None:
        """COMMIT_OFFSET to each queue's leader; ``release`` ends this member's claims there."""
        routes = self._runtime.routes
        by_broker: dict[str, dict[str, list[tuple]]] = defaultdict(lambda: {"offsets": [], "release": []})
        first: dict[str, TopicQueue] = {}  # a queue of each broker's request
        for queue, offset in offsets.items():
            broker = await leader_of(routes, queue)
            by_broker[broker]["offsets"].append(encode(QueueOffset(queue.topic, queue.queue_id, offset)))
            first.setdefault(broker, queue)
        for queue in release:
            try:
                broker = await leader_of(routes, queue)
            except ServiceUnavailableError:
                continue  # no leader now: the claim lapses by itself
            by_broker[broker]["release"].append(encode(QueueRef(queue.topic, queue.queue_id)))
            first.setdefault(broker, queue)
        # Given up once the first queue of a broker's request has another leader (its broker lost
        # its lease): the next commit goes to the new one.
        await asyncio.gather(*(
            leader_request(routes, self._runtime.pool, first[broker].topic, first[broker].queue_id, broker,
                           RequestCode.COMMIT_OFFSET, {"group": self._group, "member": self._member, **items})
            for broker, items in by_broker.items()))

    async def restart(self, state: QueueState, position: int | None) -> None:
        """Fetch ``state``'s queue again from ``position`` (None: from where it starts), dropping
        what was fetched but not polled (seek, resume)."""
        await self._fetcher.stop(state)
        state.position = position
        if not state.paused and not state.revoked:
            self._fetcher.start(state, self._start_offset)

    async def stop(self) -> None:
        """Stop heartbeats and fetchers (the caller then commits and unregisters)."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for state in list(self.states.values()):
            await self._fetcher.stop(state)

    async def unregister(self) -> None:
        """Release every queue and leave the group (best effort, within LEAVE_TIMEOUT_S: the
        coordinator may be gone, and then expires the member by itself)."""
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await self._leave()
        except (GmsError, TimeoutError) as err:
            log.info("%s/%s: leaving the group: %r", self._group, self._member, err)

    async def _leave(self) -> None:
        if self._clustering:
            await self._send_commits({}, list(self.states))
        # Found again if a heartbeat failed or was cancelled by stop(): a member that does not
        # say it leaves keeps its queues from the others until it expires (30 s by default).
        await self._runtime.pool.request(await self._find_coordinator(), RequestCode.UNREGISTER_CONSUMER,
                                         {"group": self._group, "member": self._member})

    # --- heartbeats ------------------------------------------------------------------------------

    async def _beat_forever(self) -> None:
        assert self._wake is not None
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the cancellation
        # stop() sends when the wake-up lands at the same moment, and this loop then beat on
        # forever (a closing consumer kept its queues and its close() never returned).
        while True:
            try:
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._bounded_heartbeat()
            except Exception as err:  # noqa: BLE001 - keep beating; the coordinator may come back
                self._beat_outage.failed(repr(err))
                self._runtime.routes.invalidate()
                await asyncio.sleep(HEARTBEAT_RETRY_MS / 1000)
            else:
                self._beat_outage.recovered()

    def _schedule_fence(self) -> None:
        """Fence one member expiry after the last answered heartbeat was sent (unless another
        is answered before: it schedules again)."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        assert self._last_beat_sent is not None
        left_s = self._last_beat_sent + self._member_expiry_s - time.monotonic()
        self._fence_timer = asyncio.get_running_loop().call_later(max(left_s, 0), self._fence_if_expired)

    def _fence_if_expired(self) -> None:
        """After a member expiry without an answered heartbeat, give every queue up (lost)."""
        sent = self._last_beat_sent
        if sent is None:
            return
        if time.monotonic() - sent < self._member_expiry_s:  # the loop's timers may fire early
            self._schedule_fence()
            return
        lost = [q for q, s in self.states.items() if not s.revoked]
        if lost:
            log.warning("%s/%s: no heartbeat answered for %.1f s; giving up queues %s",
                        self._group, self._member, time.monotonic() - sent, lost)
            self._revoke(lost, lost=True)

    async def _bounded_heartbeat(self) -> None:
        """A heartbeat (routes, coordinator and beat together) within half the member expiry: a
        later answer is no use — better try again, or fence."""
        try:
            async with asyncio.timeout(self._member_expiry_s / 2):
                await self.heartbeat()
        except TimeoutError:
            self._coordinator = None  # it did not answer in time: found again for the next beat
            raise

    async def heartbeat(self) -> None:
        assert self._beat_lock is not None
        async with self._beat_lock:  # one assignment change at a time
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        fields = {
            "group": self._group, "member": self._member, "subscription": await self._existing_subscription(),
            "mode": "clustering" if self._clustering else "broadcasting",
            "held": [encode(QueueRef(q.topic, q.queue_id)) for q in self.states],
        }
        sent = time.monotonic()
        try:
            frame = await self._beat(fields)
        except GmsError:  # not when cancelled (stop): the coordinator is still the one to leave
            self._coordinator = None
            raise
        self._last_beat_sent = sent
        self._member_expiry_s = frame.fields.get("member_expiry_ms", DEFAULT_MEMBER_EXPIRY_MS) / 1000
        if self._clustering:
            self._schedule_fence()
        hint_ms = frame.fields.get("heartbeat_interval_ms")
        if hint_ms:
            chosen_ms = hint_ms if self._heartbeat_interval_ms is None else min(hint_ms, self._heartbeat_interval_ms)
            self._interval_s = chosen_ms / 1000
        assigned = {TopicQueue(topic, q) for topic, queue_ids in frame.fields["assignment"].items()
                    for q in queue_ids}
        self._apply(assigned)

    async def _existing_subscription(self) -> dict[str, str]:
        """The subscription of the topics that exist (their routes looked up together). Joining,
        an unknown topic raises TopicNotFoundError; later, a topic deleted meanwhile is left out
        (logged once): the coordinator takes its queues away, the other topics go on, and it is
        read again if it comes back."""
        topics = list(self._subscription)
        found = await asyncio.gather(*(self._runtime.routes.routes(t) for t in topics), return_exceptions=True)
        missing = set()
        for topic, answer in zip(topics, found, strict=True):
            if isinstance(answer, TopicNotFoundError) and self._last_beat_sent is not None:
                missing.add(topic)
            elif isinstance(answer, BaseException):
                raise answer
        for topic in sorted(missing - self._missing):
            log.warning("%s/%s: subscribed topic %s no longer exists: its queues are given up (read again if it"
                        " is created again)", self._group, self._member, topic)
        self._missing = missing
        return {t: e for t, e in self._subscription.items() if t not in missing}

    async def _beat(self, fields: dict[str, Any]) -> Frame:
        """One heartbeat to the coordinator. The routes named every subscribed topic, so a
        coordinator that does not know one yet has not heard of its creation: asked again for
        up to TOPIC_LAG_S."""
        deadline = time.monotonic() + TOPIC_LAG_S
        while True:
            try:
                try:
                    return await self._beat_once(fields)
                except NotCoordinatorError as err:
                    self._coordinator = err.fields.get("coordinator") or None
                    return await self._beat_once(fields)
            except TopicNotFoundError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(TOPIC_LAG_RETRY_S)

    async def _beat_once(self, fields: dict[str, Any]) -> Frame:
        """HEARTBEAT to the coordinator, given up once it is no longer registered (a paused
        broker's lease lapses: the group has another coordinator then)."""
        coordinator = await self._find_coordinator()

        async def unregistered() -> GmsError | None:
            try:
                if coordinator in await self._runtime.routes.live_brokers():
                    return None
            except GmsError:
                return None  # not known now: the heartbeat waits on
            return ServiceUnavailableError(f"the coordinator {coordinator} of group {self._group} did not answer"
                                           " and is no longer registered: heartbeat abandoned")

        return await abandon_when(self._runtime.pool.request(coordinator, RequestCode.HEARTBEAT, fields),
                                  unregistered, COORDINATOR_CHECK_INTERVAL_MS)

    async def _find_coordinator(self) -> str:
        """The group's coordinator, asking the live brokers (then the others known) if unknown."""
        if self._coordinator is not None:
            return self._coordinator
        routes = self._runtime.routes
        # The registered brokers first: a paused one that lost its lease would not answer.
        candidates = list(dict.fromkeys([*await routes.live_brokers(), *routes.brokers]))
        failures = []
        for broker in candidates:
            try:
                frame = await self._runtime.pool.request(broker, RequestCode.FIND_COORDINATOR, {"group": self._group})
            except (ForbiddenError, UnauthenticatedError):
                raise  # every broker answers the same: the user needs a grant, not another broker
            except GmsError as err:
                failures.append(f"{broker}: {err}")
                continue
            self._coordinator = str(frame.fields["coordinator"])
            return self._coordinator
        raise ServiceUnavailableError(f"no broker named the coordinator of group {self._group!r}"
                                      f" ({'; '.join(failures) or 'no brokers'})")

    def _apply(self, assigned: set[TopicQueue]) -> None:
        self._revoke([q for q, s in self.states.items() if q not in assigned and not s.revoked])
        added = sorted(q for q in assigned if q not in self.states)
        for queue in added:
            self.states[queue] = QueueState(queue)
        if added:
            self._fetcher.start_many([self.states[q] for q in added], self._start_offsets, self._start_offset)
            log.info("%s/%s: queues assigned %s", self._group, self._member, added)
            with self._events_lock:
                self._events.append(RebalanceEvent(True, added))

    def _revoke(self, queues: list[TopicQueue], *, lost: bool = False) -> None:
        if not queues:
            return
        for queue in queues:
            state = self.states[queue]
            state.revoked = True
            self._fetcher.abandon(state)
            if lost:  # nothing to commit: forget the queue now
                del self.states[queue]
        log.info("%s/%s: queues %s %s", self._group, self._member, "lost" if lost else "revoked", queues)
        with self._events_lock:
            self._events.append(RebalanceEvent(False, queues, lost))

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- where a queue starts --------------------------------------------------------------------

    async def _start_offset(self, queue: TopicQueue) -> tuple[int, int | None]:
        """(where to fetch from, committed) of a newly assigned queue: the committed offset (the
        group's on the queue's leader, or this instance's own when broadcasting), else
        ``start_from`` (``first`` / ``last`` as FETCH's EARLIEST / LATEST: the first answer says
        where that is)."""
        if self._clustering:
            committed: int | None = await self._committed(queue)
        else:
            committed = None if self._local_offsets is None else self._local_offsets.get(queue)
        if committed is not None and committed >= 0:
            return committed, committed
        if self._start_from in ("first", "last"):
            return (EARLIEST if self._start_from == "first" else LATEST), None
        return await self.query_offset(queue, self._start_from), None

    async def _start_offsets(self, queues: list[TopicQueue],
                             led: Mapping[TopicQueue, str]) -> list[tuple[int, int | None] | None]:
        """:meth:`_start_offset` of newly assigned ``queues`` (led by ``led``) at once: the
        committed offsets in one FETCH_OFFSET per broker; None for a queue to place alone (its
        committed offset not known now, or a start at a timestamp, asked of its leader)."""
        if self._clustering:
            by_broker: dict[str, list[TopicQueue]] = defaultdict(list)
            for queue in queues:
                if queue in led:
                    by_broker[led[queue]].append(queue)
            asked = list(by_broker.items())
            answers = await asyncio.gather(*(self._fetch_offsets(broker, part) for broker, part in asked))
            known = {q: a for (_, part), found in zip(asked, answers, strict=True)
                     for q, a in zip(part, found, strict=True) if not isinstance(a, BaseException)}
            committed = [known.get(q) for q in queues]
        else:
            own = self._local_offsets
            committed = [NO_COMMITTED_OFFSET if own is None or (at := own.get(q)) is None else at for q in queues]
        start: tuple[int, int | None] | None = None
        if self._start_from in ("first", "last"):
            start = (EARLIEST if self._start_from == "first" else LATEST), None
        return [None if c is None else (c, c) if c >= 0 else start for c in committed]

    async def _committed(self, queue: TopicQueue) -> int:
        """The group's committed offset of ``queue`` (-1: none), asked of its leader in one
        FETCH_OFFSET with every other queue of that broker asked for meanwhile."""
        broker = await leader_of(self._runtime.routes, queue)
        loop = asyncio.get_running_loop()
        batch = self._offset_batches.get(broker)
        if batch is None:
            batch = self._offset_batches[broker] = []
            loop.call_soon(lambda: loop.create_task(self._answer_offsets(broker, batch)))
        answer: asyncio.Future[int] = loop.create_future()
        batch.append((queue, answer))
        return await answer

    async def _answer_offsets(self, broker: str, batch: list[tuple[TopicQueue, asyncio.Future[int]]]) -> None:
        if self._offset_batches.get(broker) is batch:
            del self._offset_batches[broker]
        found = await self._fetch_offsets(broker, [queue for queue, _ in batch])
        for (_, answer), offset in zip(batch, found, strict=True):
            if answer.done():
                continue
            if isinstance(offset, BaseException):
                answer.set_exception(offset)
            else:
                answer.set_result(offset)

    async def _fetch_offsets(self, broker: str, queues: list[TopicQueue]) -> list[int | GmsError]:
        """The group's committed offsets of ``queues`` (-1: none), asked of their leader
        ``broker``, or why not (a queue held by another member fails alone)."""
        first = queues[0]
        try:
            frame = await leader_request(
                self._runtime.routes, self._runtime.pool, first.topic, first.queue_id, broker,
                RequestCode.FETCH_OFFSET, {"group": self._group, "member": self._member,
                                           "queues": [encode(QueueRef(q.topic, q.queue_id)) for q in queues]})
        except QueueHeldError as err:
            if len(queues) > 1:  # another member still reads some: ask for each alone, the others start
                alone = await asyncio.gather(*(self._fetch_offsets(broker, [queue]) for queue in queues))
                return [found for one in alone for found in one]
            return [err]
        except GmsError as err:
            return [err] * len(queues)
        return list(frame.fields["offsets"])

    async def query_offset(self, queue: TopicQueue, where: StartFrom) -> int:
        """The offset of ``queue`` at ``where``: "first", "last" or a timestamp in ms."""
        fields: dict[str, object] = {"topic": queue.topic, "queue_id": queue.queue_id}
        if where == "first":
            code = RequestCode.QUERY_MIN_OFFSET
        elif where == "last":
            code = RequestCode.QUERY_MAX_OFFSET
        else:
            code = RequestCode.QUERY_OFFSET_BY_TIME
            fields["timestamp_ms"] = int(where)
        frame = await self._leader_request(queue, code, fields)
        return int(frame.fields["offset"])

    async def _leader_request(self, queue: TopicQueue, code: int, fields: Mapping[str, Any]) -> Frame:
        """``code`` to ``queue``'s leader, given up once another broker leads it (LeaderMovedError)."""
        routes = self._runtime.routes
        return await leader_request(routes, self._runtime.pool, queue.topic, queue.queue_id,
                                    await leader_of(routes, queue), code, fields)
