"""Consumer group administration: describe a group, its coordinator and live members, reset or
delete its committed offsets, and its settings kept by the nameservers."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gms.client.admin.base import AdminBase
from gms.client.offset_reset import QueueReset, ResetMode, ResetSpec, new_offset
from gms.client.rebalance import NO_COMMITTED_OFFSET
from gms.client.routing import QueueRoute
from gms.cluster.model import GroupSettings
from gms.errors import (
    GmsError,
    GroupNotEmptyError,
    GroupNotFoundError,
    QueueNotFoundError,
    ServiceUnavailableError,
)
from gms.protocol.codes import RequestCode
from gms.protocol.groups import QueueOffset, QueueRef, queue_offsets, queue_refs
from gms.protocol.rows import encode


class GroupAdmin(AdminBase):
    """The consumer group calls of :class:`~gms.client.admin.AsyncAdmin`."""

    async def group_describe(self, group: str) -> dict[str, Any]:
        """Members of ``group`` (from its coordinator) and its committed offsets (from every
        broker), keyed by broker: ``{broker: {topic: {queue_id: offset}}}``. A member is listed
        once per broker leading queues it holds (``broker``, ``queues``: those queues), or once
        with its coordinator as ``broker`` while it holds none."""
        brokers = await self.brokers()
        answers = await self._describe_on(group, brokers)
        members: list[Any] = []
        offsets: dict[str, dict[str, dict[int, int]]] = {}
        known = False
        for broker, answer in zip(brokers, answers, strict=True):
            if isinstance(answer, GroupNotFoundError):
                continue
            if isinstance(answer, BaseException):
                raise answer
            known = True
            for member in answer["members"]:
                members.extend(await self._member_by_leader(member, broker))
            offsets[broker] = {topic: {int(q): o for q, o in queues.items()}
                               for topic, queues in answer["offsets"].items()}
        if not known:
            raise GroupNotFoundError(f"no broker of {brokers} knows group {group!r}")
        return {"group": group, "members": members, "offsets": offsets}

    async def group_coordinator(self, group: str) -> str | None:
        """The address of the broker coordinating ``group`` (None if no broker answers)."""
        return await self._find_coordinator(group, (await self.brokers()))

    async def _find_coordinator(self, group: str, brokers: list[str]) -> str | None:
        for broker in brokers:  # the first that answers names it
            with contextlib.suppress(GmsError):
                frame = await self._runtime.pool.request(broker, RequestCode.FIND_COORDINATOR, {"group": group})
                return str(frame.fields["coordinator"])
        return None

    async def _describe_on(self, group: str, brokers: list[str]) -> list[Any]:
        """GET_CONSUMER_GROUP_MEMBERS on every broker: with members on the coordinator only."""
        pool = self._runtime.pool
        coordinator = await self._find_coordinator(group, brokers)

        async def ask(broker: str) -> dict[str, Any]:
            fields = {"group": group, "members": broker == coordinator}
            return dict((await pool.request(broker, RequestCode.GET_CONSUMER_GROUP_MEMBERS, fields)).fields)
        return list(await asyncio.gather(*(ask(b) for b in brokers), return_exceptions=True))

    async def _member_by_leader(self, member: dict[str, Any], coordinator: str) -> list[dict[str, Any]]:
        by_leader: dict[str, list[QueueRef]] = defaultdict(list)
        for queue in queue_refs(member, "queues"):
            leaders = {r.queue_id: r.broker for r in await self._runtime.routes.routes(queue.topic)}
            by_leader[leaders.get(queue.queue_id, coordinator)].append(queue)
        if not by_leader:
            return [{**member, "broker": coordinator}]
        return [{**member, "broker": leader, "queues": queues} for leader, queues in by_leader.items()]

    async def groups(self) -> list[str]:
        """Names of the consumer groups any live broker knows."""
        names: set[str] = set()
        for status in await self.broker_status():
            names.update(status.get("groups", ()))
        return sorted(names)

    # --- group offsets an operator sets or deletes ---------------------------------------------------

    async def live_members(self, group: str) -> list[str]:
        """Ids of ``group``'s live members (none if no broker knows the group)."""
        try:
            return _member_ids(await self.group_describe(group))
        except GroupNotFoundError:
            return []

    async def reset_offsets(self, group: str, topics: Sequence[str], spec: ResetSpec, *,
                            queues: Sequence[int] | None = None, execute: bool = False,
                            force: bool = False) -> list[QueueReset]:
        """Where ``spec`` moves ``group``'s committed offset on every queue of ``topics`` (or
        only ``queues`` of each): the plan, one row per queue, clamped to what consumers can
        read. With ``execute`` the queue leaders store it and the rows hold what they stored.

        Executing is refused (GroupNotEmptyError) while the group has live members, unless
        ``force``; planning never is. TopicNotFoundError / QueueNotFoundError name what does
        not exist; a queue without a live leader is ServiceUnavailableError.
        """
        if execute and not force and (members := await self.live_members(group)):
            raise _group_not_empty(group, members, "reset the offsets")
        routes = [route for topic in dict.fromkeys(topics) for route in await self._queue_routes(topic, queues)]
        plan = await self._plan_reset(group, routes, spec)
        return await self._apply_reset(group, plan, force) if execute else plan

    async def _queue_routes(self, topic: str, queues: Sequence[int] | None) -> list[QueueRoute]:
        """The leader of each queue asked for (every queue of the topic by default)."""
        routes = {r.queue_id: r for r in await self._runtime.routes.routes(topic)}
        count = len((await self.route(topic))["queues"]) if self._nameserver is not None else len(routes)
        wanted = sorted(set(queues)) if queues else list(range(count))
        unknown = [q for q in wanted if not 0 <= q < count]
        if unknown:
            raise QueueNotFoundError(f"topic {topic!r} has queues 0..{count - 1}, not {', '.join(map(str, unknown))}")
        leaderless = [q for q in wanted if q not in routes]
        if leaderless:
            raise ServiceUnavailableError(f"queue(s) {', '.join(map(str, leaderless))} of topic {topic!r} have no"
                                          " live leader now; retry once their broker is back")
        return [routes[q] for q in wanted]

    async def _plan_reset(self, group: str, routes: list[QueueRoute], spec: ResetSpec) -> list[QueueReset]:
        pool = self._runtime.pool
        by_broker: dict[str, list[QueueRoute]] = defaultdict(list)
        for route in routes:
            by_broker[route.broker].append(route)

        async def committed_on(broker: str, items: list[QueueRoute]) -> list[tuple[QueueRoute, int]]:
            frame = await pool.request(broker, RequestCode.FETCH_OFFSET, {
                "group": group, "queues": [encode(QueueRef(r.topic, r.queue_id)) for r in items]})
            return list(zip(items, frame.fields["offsets"], strict=True))

        async def offset(route: QueueRoute, code: RequestCode, **extra: int) -> int:
            frame = await pool.request(route.broker, code, {"topic": route.topic, "queue_id": route.queue_id, **extra})
            return int(frame.fields["offset"])

        committed = dict(pair for pairs in await asyncio.gather(
            *(committed_on(b, items) for b, items in by_broker.items())) for pair in pairs)

        async def plan(route: QueueRoute) -> QueueReset:
            low, high = await asyncio.gather(offset(route, RequestCode.QUERY_MIN_OFFSET),
                                             offset(route, RequestCode.QUERY_MAX_OFFSET))
            found = (await offset(route, RequestCode.QUERY_OFFSET_BY_TIME, timestamp_ms=spec.value)
                     if spec.mode is ResetMode.DATETIME else None)
            current = None if committed[route] == NO_COMMITTED_OFFSET else committed[route]
            return QueueReset(route.topic, route.queue_id, route.broker, current,
                              new_offset(spec, committed=current, min_offset=low, max_offset=high,
                                         offset_for_time=found), low, high)

        return list(await asyncio.gather(*(plan(r) for r in routes)))

    async def _apply_reset(self, group: str, plan: list[QueueReset], force: bool) -> list[QueueReset]:
        """RESET_OFFSETS on each leader; the rows with the offsets the leaders stored (they clamp
        again, to the range at that moment)."""
        by_broker: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for row in plan:
            if row.new_offset is not None:
                by_broker[row.broker].append(encode(QueueOffset(row.topic, row.queue_id, row.new_offset)))
        answers = await asyncio.gather(*(
            self._runtime.pool.request(broker, RequestCode.RESET_OFFSETS,
                                       {"group": group, "offsets": offsets, "force": force})
            for broker, offsets in by_broker.items()))
        stored = {(t, q): o for frame in answers for t, q, o in queue_offsets(frame.fields, "offsets")}
        return [row._replace(new_offset=stored.get((row.topic, row.queue_id), row.new_offset)) for row in plan]

    async def delete_group(self, group: str, *, force: bool = False) -> dict[str, list[tuple[str, int]]]:
        """Delete ``group``'s committed offsets on every live broker (queue leaders and their
        followers), so it is no longer listed; returns, per broker, the queues it had offsets on.

        GroupNotFoundError if no broker knows the group; GroupNotEmptyError while it has live
        members, unless ``force`` (its members then commit again and the group comes back).
        """
        members = _member_ids(await self.group_describe(group))
        if members and not force:
            raise _group_not_empty(group, members, "delete the offsets")
        brokers = await self.brokers()
        answers = await self._ask(brokers, RequestCode.DELETE_GROUP, {"group": group, "force": force})
        return {b: [(ref.topic, ref.queue_id) for ref in queue_refs(a, "queues")]
                for b, a in zip(brokers, answers, strict=True)}

    # --- consumer group settings (kept in etcd by the nameservers) --------------------------------

    async def set_group_settings(self, group: str, *, create: bool = False, **settings: Any) -> GroupSettings:
        """Set ``group``'s settings (``max_reconsume_times``, ``retry_delays_ms``, ``fifo``):
        those given replace the stored ones; returns the settings now in force. Its consumers
        use them unless given their own (read when a consumer starts). ``create``: only for a
        group without settings of its own (BadRequestError otherwise)."""
        GroupSettings.from_dict(settings)  # unknown names and bad values fail here
        if "retry_delays_ms" in settings:
            settings["retry_delays_ms"] = list(settings["retry_delays_ms"])
        answer = await self._ask_nameserver(RequestCode.GROUP_SETTINGS_PUT,
                                      {"group": group, "settings": settings, "create": create})
        return GroupSettings.from_dict(answer["settings"])

    async def group_settings(self, group: str) -> GroupSettings | None:
        """``group``'s settings, None if it has none of its own."""
        found = (await self._ask_nameserver(RequestCode.GROUP_SETTINGS_GET, {"group": group}))["settings"]
        return None if found is None else GroupSettings.from_dict(found)

    async def delete_group_settings(self, group: str) -> bool:
        """Back to the defaults; False if the group had no settings."""
        return bool((await self._ask_nameserver(RequestCode.GROUP_SETTINGS_DELETE, {"group": group}))["deleted"])


def _member_ids(described: Mapping[str, Any]) -> list[str]:
    return sorted({m["member"] for m in described["members"]})


def _group_not_empty(group: str, members: list[str], action: str) -> GroupNotEmptyError:
    return GroupNotEmptyError(f"cannot {action} of group {group!r} while it has {len(members)} live"
                              f" member(s) (they would commit over it): {', '.join(members)}")
