"""Which queues this consumer reads, kept current by heartbeats (runs on the I/O loop).

Clustering follows the broker's hand-off: HEARTBEAT reports the queues still ``held`` and
returns the assignment. A queue missing from the assignment is *revoked*: its fetcher stops at
once, but it stays held until the polling thread has committed its position and released it
(:meth:`Membership.release`, then an immediate heartbeat), so the next owner starts exactly
where this one stopped. Broadcasting: every member reads every queue from its own positions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gms.client.fetcher import Fetcher, QueueState
from gms.client.routing import QueueRoute
from gms.client.runtime import ClientRuntime
from gms.protocol.codes import RequestCode

log = logging.getLogger(__name__)

StartFrom = str | int  # "last", "first" or a timestamp in ms
NO_COMMITTED_OFFSET = -1
HEARTBEAT_RETRY_MS = 500


class Membership:
    def __init__(self, runtime: ClientRuntime, fetcher: Fetcher, *, group: str, member: str,
                 clustering: bool, subscription: Mapping[str, str], start_from: StartFrom,
                 heartbeat_interval_ms: float | None) -> None:
        self._runtime = runtime
        self._fetcher = fetcher
        self._group = group
        self._member = member
        self._clustering = clustering
        self._subscription = dict(subscription)
        self._start_from = start_from
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._interval_s = (heartbeat_interval_ms or 3000) / 1000
        self.states: dict[QueueRoute, QueueState] = {}
        self._revoked: list[QueueRoute] = []  # waiting for the polling thread
        self._revoked_lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._beat_lock: asyncio.Lock | None = None

    # --- called from the polling thread (through runtime.run) or the loop ----------------------

    def take_revoked(self) -> list[QueueRoute]:
        """The queues revoked since the last call (for the polling thread to commit and release)."""
        with self._revoked_lock:
            revoked, self._revoked = self._revoked, []
        return revoked

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._beat_lock = asyncio.Lock()
        await self.heartbeat()
        self._task = asyncio.get_running_loop().create_task(self._beat_forever())

    async def release(self, routes: Iterable[QueueRoute]) -> None:
        """Stop holding ``routes`` (positions committed) and tell the brokers now."""
        for route in routes:
            self.states.pop(route, None)
        await self.heartbeat()

    async def commit(self, offsets: Mapping[QueueRoute, int]) -> None:
        by_broker: dict[str, list[list[object]]] = defaultdict(list)
        for route, offset in offsets.items():
            by_broker[route.broker].append([route.topic, route.queue_id, offset])
        await asyncio.gather(*(
            self._runtime.pool.request(broker, RequestCode.COMMIT_OFFSET,
                                       {"group": self._group, "member": self._member, "offsets": items})
            for broker, items in by_broker.items()))

    async def stop(self) -> None:
        """Stop heartbeats and fetchers (the caller then commits and unregisters)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        tasks = [s.task for s in self.states.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def unregister(self) -> None:
        brokers = {route.broker for route in self.states} | set(self._runtime.routes.brokers)
        await asyncio.gather(*(
            self._runtime.pool.request(b, RequestCode.UNREGISTER_CONSUMER,
                                       {"group": self._group, "member": self._member})
            for b in brokers), return_exceptions=True)

    # --- heartbeats ------------------------------------------------------------------------------

    async def _beat_forever(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.heartbeat()
            except Exception as err:  # noqa: BLE001 - keep beating; the broker may come back
                log.warning("heartbeat of %s/%s failed: %r", self._group, self._member, err)
                self._runtime.routes.invalidate()
                await asyncio.sleep(HEARTBEAT_RETRY_MS / 1000)

    async def heartbeat(self) -> None:
        assert self._beat_lock is not None
        async with self._beat_lock:  # one assignment change at a time
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        routes_by_broker: dict[str, dict[str, list[QueueRoute]]] = defaultdict(dict)
        for topic in self._subscription:
            for route in await self._runtime.routes.routes(topic):
                routes_by_broker[route.broker].setdefault(topic, []).append(route)
        assigned: set[QueueRoute] = set()
        for broker, topics in routes_by_broker.items():
            held = [[r.topic, r.queue_id] for r in self.states if r.broker == broker]
            frame = await self._runtime.pool.request(broker, RequestCode.HEARTBEAT, {
                "group": self._group, "member": self._member,
                "mode": "clustering" if self._clustering else "broadcasting",
                "subscription": {t: self._subscription[t] for t in topics}, "held": held,
            })
            expiry_ms = frame.fields.get("member_expiry_ms")
            if self._heartbeat_interval_ms is None and expiry_ms:
                self._interval_s = expiry_ms / 3000
            if self._clustering:
                routed = {r for routes in topics.values() for r in routes}
                for topic, queue_ids in frame.fields["assignment"].items():
                    # Only queues the route says this broker leads (it may hold others' replicas).
                    assigned.update(r for r in (QueueRoute(topic, q, broker) for q in queue_ids) if r in routed)
            else:
                assigned.update(r for routes in topics.values() for r in routes)
        await self._apply(assigned)

    async def _apply(self, assigned: set[QueueRoute]) -> None:
        revoked = [r for r, s in self.states.items() if r not in assigned and not s.revoked]
        for route in revoked:
            state = self.states[route]
            state.revoked = True
            if state.task is not None:
                state.task.cancel()
        if revoked:
            log.info("%s/%s: queues revoked %s", self._group, self._member, revoked)
            with self._revoked_lock:
                self._revoked.extend(revoked)
        added = [r for r in assigned if r not in self.states]
        if not added:
            return
        committed = await self._committed(added) if self._clustering else [NO_COMMITTED_OFFSET] * len(added)
        for route, offset in zip(added, committed):
            position = offset if offset >= 0 else await self._start_offset(route)
            state = QueueState(route, position, offset)
            self.states[route] = state
            self._fetcher.start(state)
        log.info("%s/%s: queues assigned %s", self._group, self._member, added)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- offsets ---------------------------------------------------------------------------------

    async def _committed(self, routes: list[QueueRoute]) -> list[int]:
        by_broker: dict[str, list[QueueRoute]] = defaultdict(list)
        for route in routes:
            by_broker[route.broker].append(route)
        found: dict[QueueRoute, int] = {}
        for broker, items in by_broker.items():
            frame = await self._runtime.pool.request(broker, RequestCode.FETCH_OFFSET, {
                "group": self._group, "queues": [[r.topic, r.queue_id] for r in items]})
            found.update(zip(items, frame.fields["offsets"]))
        return [found[r] for r in routes]

    async def _start_offset(self, route: QueueRoute) -> int:
        """Where to start a queue the group never committed: ``start_from``."""
        where = {"topic": route.topic, "queue_id": route.queue_id}
        if self._start_from == "first":
            code = RequestCode.QUERY_MIN_OFFSET
        elif self._start_from == "last":
            code = RequestCode.QUERY_MAX_OFFSET
        else:
            code = RequestCode.QUERY_OFFSET_BY_TIME
            where["timestamp_ms"] = int(self._start_from)
        frame = await self._runtime.pool.request(route.broker, code, where)
        return int(frame.fields["offset"])
