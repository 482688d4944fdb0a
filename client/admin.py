"""Topic administration and inspection: the helper behind scripts, tests and the ``gms`` CLI, an
asyncio core (:class:`AsyncAdmin`) and its synchronous facade (:class:`Admin`).

With ``nameserver=...`` topic changes are cluster metadata (the nameserver places the queues
and the brokers create them); inspection asks the brokers the routes name. With ``brokers=[...]``
every call goes to each of those brokers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from gms.client.body_decode import decode_pull_body
from gms.client.connections import msg_id_prefix
from gms.client.offset_reset import QueueReset, ResetMode, ResetSpec, new_offset
from gms.client.rebalance import NO_COMMITTED_OFFSET
from gms.client.routing import UNREACHABLE_ERRORS, NameserverRoutes, QueueRoute
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import ReceivedMessage
from gms.client.trace_format import STORE, TRACE_TOPIC, TraceEvent, decode_events, ordered, region_key
from gms.cluster.model import GroupSettings
from gms.errors import (
    GmsError,
    GroupNotEmptyError,
    GroupNotFoundError,
    MessageNotFoundError,
    QueueNotFoundError,
    ServiceUnavailableError,
    TopicNotFoundError,
    TransactionNotFoundError,
    error_for_status,
)
from gms.msgid import MessageId, decode_msg_id
from gms.protocol.codes import RequestCode, Status
from gms.protocol.frame import Frame
from gms.protocol.groups import QueueOffset, QueueRef, TransactionQueue, queue_offsets, queue_refs
from gms.protocol.rows import decode, encode
from gms.protocol.topic_batch import CREATE_TOPICS_MAX
from gms.security.acl import AclRule
from gms.security.client import ClientSecurity
from gms.security.scram import Credential
from gms.security.users import check_user_name
from gms.tags import MATCH_ALL

DEFAULT_QUEUE_COUNT = 8
TRACE_RECORDS_MAX = 256  # trace records of one message each broker answers (FIND_BY_KEY)
DELETE_TOPICS_IN_FLIGHT = 32  # DELETE_TOPIC requests of one delete_topics call awaiting their answers


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """One topic of :meth:`Admin.create_topics` (the arguments of ``create_topic``)."""

    name: str
    queues: int = DEFAULT_QUEUE_COUNT
    settings: Mapping[str, Any] | None = None
    replicas: int = 1

    def fields(self, *, replicas: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {"topic": self.name, "queues": self.queues}
        if self.settings:
            fields["settings"] = dict(self.settings)
        if replicas:
            fields["replicas"] = self.replicas
        return fields


@dataclasses.dataclass(frozen=True)
class TopicResult:
    """What became of one topic of :meth:`Admin.create_topics` (or ``delete_topics``): created
    (deleted) when ``error`` is None (then ``queues``, and with a nameserver
    ``replication_factor`` and ``brokers``: the addresses holding its queues), else the error its
    own ``create_topic`` would have raised (TopicAlreadyExistsError, InvalidTopicError,
    NotEnoughReplicasError...)."""

    topic: str
    error: GmsError | None = None
    queues: int | None = None
    replication_factor: int | None = None
    brokers: tuple[str, ...] = ()

    @property
    def created(self) -> bool:
        return self.error is None

    @property
    def deleted(self) -> bool:
        return self.error is None

    @classmethod
    def from_row(cls, topic: str, row: Mapping[str, Any]) -> TopicResult:
        if row["status"] != Status.SUCCESS:
            return cls(topic, error_for_status(row["status"], row.get("error", "")))
        return cls(topic, None, row.get("queues"), row.get("replication_factor"), tuple(row.get("brokers", ())))


class AsyncAdmin:
    """Administers a cluster through its nameservers, or a fixed list of brokers, from asyncio code
    (on the caller's running loop; ``async with`` or ``await aclose()``). Every call of
    :class:`Admin` is this class's, run on the synchronous admin's loop thread."""

    def __init__(self, brokers: Sequence[str] | str | None = None, *,
                 nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, security: ClientSecurity | None = None) -> None:
        """``security``: TLS and user (None: from ``GMS_TLS_*``, ``GMS_USER``, ``GMS_PASSWORD``)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("create AsyncAdmin inside a coroutine: it runs on the caller's event loop") from None
        self._attach(ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                   name="gms-admin", security=security, loop=loop))

    @classmethod
    def _driven(cls, runtime: ClientRuntime) -> AsyncAdmin:
        """The core of a synchronous :class:`Admin` on ``runtime`` (its loop thread)."""
        admin = cls.__new__(cls)
        admin._attach(runtime)
        return admin

    def _attach(self, runtime: ClientRuntime) -> None:
        self._runtime = runtime
        routes = runtime.routes
        self._nameserver = routes if isinstance(routes, NameserverRoutes) else None

    # --- plumbing ------------------------------------------------------------------------------

    async def brokers(self) -> list[str]:
        """Addresses of the live brokers (registered with the nameservers, or the given list)."""
        return await self._runtime.routes.live_brokers()

    async def _ask_nameserver(self, code: int, fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self._nameserver is None:
            raise ValueError("this needs a nameserver; this Admin was given brokers")
        return dict((await self._nameserver.request(code, fields)).fields)

    async def _ask(self, brokers: Sequence[str], code: int, fields: Mapping[str, Any] | None = None,
                   *, errors: bool = False) -> list[Any]:
        """``code`` on every broker at once: answers' fields (or, with ``errors``, the exceptions)."""
        async def ask() -> list[Any]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, code, fields) for b in brokers), return_exceptions=errors))
        return [a if isinstance(a, BaseException) else dict(a.fields) for a in await ask()]

    # --- topics --------------------------------------------------------------------------------

    async def create_topic(self, topic: str, queues: int = DEFAULT_QUEUE_COUNT, *, replicas: int = 1,
                           settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create ``topic``; with a nameserver, returns its route (as GET_ROUTE answers it) with
        its replication factor and settings. A broker without a nameserver takes the settings
        ``retention_ms``, ``message_size_bytes_max``, ``message_type`` and the compaction settings
        (``cleanup_policy`` "compact" or "compact,delete", ``min_compaction_lag_ms``, ``dirty_ratio``,
        ``tombstone_retention_ms``, ``segment_roll_messages``) only."""
        fields: dict[str, Any] = {"topic": topic, "queues": queues}
        if settings:
            fields["settings"] = dict(settings)
        if self._nameserver is None:
            await self._ask(await self.brokers(), RequestCode.CREATE_TOPIC, fields)
            return {}
        return await self._ask_nameserver(RequestCode.CREATE_TOPIC, {**fields, "replicas": replicas})

    async def create_topics(self, topics: Iterable[TopicSpec | tuple[Any, ...] | str]) -> list[TopicResult]:
        """Create many topics in one round trip (per CREATE_TOPICS_MAX of them): each a TopicSpec,
        a tuple of its fields (``(name, queues, settings)``) or a name (8 queues). A result per
        topic, in order; one topic's failure (invalid, already exists, named twice) does not fail
        the others. With a nameserver they are placed together and written to etcd in a few
        transactions, and each created topic is routed when this returns; given brokers, each
        broker creates them. Errors of the request itself (nameserver or etcd unreachable, not
        allowed) raise."""
        specs = [t if isinstance(t, TopicSpec) else TopicSpec(t) if isinstance(t, str) else TopicSpec(*t)
                 for t in topics]
        results: list[TopicResult] = []
        for start in range(0, len(specs), CREATE_TOPICS_MAX):
            part = specs[start:start + CREATE_TOPICS_MAX]
            fields = {"topics": [spec.fields(replicas=self._nameserver is not None) for spec in part]}
            rows = await self._topic_rows(fields)
            results += [TopicResult.from_row(spec.name, row) for spec, row in zip(part, rows, strict=True)]
        return results

    async def _topic_rows(self, fields: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """CREATE_TOPICS' result rows; given brokers, a topic's row is the first broker's failure."""
        if self._nameserver is not None:
            return list((await self._ask_nameserver(RequestCode.CREATE_TOPICS, fields))["topics"])
        answers = [answer["topics"]
                   for answer in await self._ask(await self.brokers(), RequestCode.CREATE_TOPICS, fields)]
        return [next((row for row in rows if row["status"] != Status.SUCCESS), rows[0])
                for rows in zip(*answers, strict=True)]

    async def update_topic(self, topic: str, queues: int | None = None, *,
                           settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Grow the queue count and/or change the settings named in ``settings``, keeping the
        others (a None value restores a setting's default)."""
        fields: dict[str, Any] = {"topic": topic}
        if queues is not None:
            fields["queues"] = queues
        if settings:
            fields["settings"] = dict(settings)
        if self._nameserver is None:
            await self._ask(await self.brokers(), RequestCode.UPDATE_TOPIC, fields)
            return {}
        return await self._ask_nameserver(RequestCode.UPDATE_TOPIC, fields)

    async def delete_topic(self, topic: str) -> None:
        if self._nameserver is None:
            await self._ask(await self.brokers(), RequestCode.DELETE_TOPIC, {"topic": topic})
        else:
            await self._ask_nameserver(RequestCode.DELETE_TOPIC, {"topic": topic})

    async def delete_topics(self, topics: Iterable[str]) -> list[TopicResult]:
        """Delete many topics, their requests sent together (DELETE_TOPICS_IN_FLIGHT at a time,
        pipelined). A result per topic, in order: deleted when ``error`` is None, else the error
        its own ``delete_topic`` would have raised (TopicNotFoundError...); one topic's failure
        does not stop the others. Errors that are not the topic's (a nameserver unreachable)
        raise."""
        names = list(topics)
        brokers = await self.brokers() if self._nameserver is None else []
        in_flight = asyncio.Semaphore(DELETE_TOPICS_IN_FLIGHT)

        async def delete(name: str) -> None:
            fields = {"topic": name}
            async with in_flight:
                if self._nameserver is not None:
                    await self._nameserver.request(RequestCode.DELETE_TOPIC, fields)
                else:
                    await asyncio.gather(*(self._runtime.pool.request(b, RequestCode.DELETE_TOPIC, fields)
                                           for b in brokers))

        async def delete_all() -> list[BaseException | None]:
            return list(await asyncio.gather(*(delete(name) for name in names), return_exceptions=True))

        results = []
        for name, outcome in zip(names, await delete_all(), strict=True):
            if outcome is not None and (not isinstance(outcome, GmsError)
                                        or isinstance(outcome, ServiceUnavailableError)):
                raise outcome
            results.append(TopicResult(name, outcome))
        return results

    async def topics(self) -> dict[str, int]:
        """Topic name → total queue count."""
        if self._nameserver is not None:
            return dict((await self._ask_nameserver(RequestCode.TOPIC_LIST))["topics"])
        merged: dict[str, int] = {}
        for answer in await self._ask(await self.brokers(), RequestCode.TOPIC_LIST):
            for topic, count in answer["topics"].items():
                merged[topic] = merged.get(topic, 0) + count
        return merged

    async def route(self, topic: str, *, settings: bool = False) -> dict[str, Any]:
        """The nameserver's route of ``topic``: queues with leader, replicas and leader epoch;
        with ``settings`` also ``replication_factor`` and ``settings``."""
        if self._nameserver is None:
            raise ValueError("routes come from a nameserver; this Admin was given brokers")
        return await self._ask_nameserver(RequestCode.GET_ROUTE, {"topic": topic, "settings": settings})

    async def topic_stats(self, topic: str) -> list[dict[str, Any]]:
        """One entry per queue served: queue_id, min_offset, max_offset and the broker holding it
        (in a cluster, only the queues each broker leads). TopicNotFoundError if no broker has it."""
        stats = (await self._topics_stats([topic], skip_missing=False))[topic]
        if isinstance(stats, GmsError):
            raise stats
        return stats

    async def topics_stats(self, topics: Iterable[str]) -> dict[str, list[dict[str, Any]] | GmsError]:
        """:meth:`topic_stats` of many topics in one request per broker (per CREATE_TOPICS_MAX
        topics): topic → its entries, or the error its route or a broker holding it failed with
        (unreachable, refused: one dead broker does not hide the rest); a topic no broker has is left out."""
        return await self._topics_stats(list(dict.fromkeys(topics)), skip_missing=True)

    async def _topics_stats(self, names: list[str], *, skip_missing: bool,
                            ) -> dict[str, list[dict[str, Any]] | GmsError]:
        routes, pool = self._runtime.routes, self._runtime.pool
        found = await asyncio.gather(*(routes.routes(name) for name in names), return_exceptions=True)
        held: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))  # broker → topic → queues
        stats: dict[str, list[dict[str, Any]] | GmsError] = {}
        for name, queues in zip(names, found, strict=True):
            if isinstance(queues, BaseException):
                if not isinstance(queues, GmsError):
                    raise queues
                if not (skip_missing and isinstance(queues, TopicNotFoundError)):
                    stats[name] = queues  # its route refused or unknown
                continue
            stats[name] = []
            for route in queues:
                held[route.broker][name].add(route.queue_id)
        asks = [(broker, part) for broker, topics in held.items()
                for part in _chunks(list(topics), CREATE_TOPICS_MAX)]
        answers = await asyncio.gather(*(pool.request(broker, RequestCode.TOPIC_STATS, {"topics": part})
                                         for broker, part in asks), return_exceptions=True)
        for (broker, part), answer in zip(asks, answers, strict=True):
            if isinstance(answer, GmsError):
                stats.update(dict.fromkeys(part, answer))
                continue
            if isinstance(answer, BaseException):
                raise answer
            for row in answer.fields["topics"]:
                name, entries = row["topic"], stats.get(row["topic"])
                if row["status"] != Status.SUCCESS:
                    err = error_for_status(row["status"], row.get("error", ""))
                    if skip_missing and isinstance(err, TopicNotFoundError):  # deleted since its route was read
                        stats.pop(name, None)
                    else:
                        stats[name] = err
                elif isinstance(entries, list):
                    entries.extend({**queue, "broker": broker} for queue in row["queues"]
                                   if queue["queue_id"] in held[broker][name])
        return {name: entries if isinstance(entries, GmsError)
                else sorted(entries, key=lambda s: (s["queue_id"], s["broker"])) for name, entries in stats.items()}

    # --- brokers, cluster, groups, messages -------------------------------------------------------

    async def broker_status(self) -> list[dict[str, Any]]:
        """BROKER_STATUS of every live broker; an unreachable one is ``{"address", "error"}``."""
        brokers = await self.brokers()
        return [{"address": b, "error": str(a)} if isinstance(a, BaseException) else a
                for b, a in zip(brokers, await self._ask(brokers, RequestCode.BROKER_STATUS, errors=True), strict=True)]

    async def cluster_status(self) -> dict[str, Any]:
        """The nameserver's CLUSTER_STATUS: etcd health, live nameservers and brokers."""
        if self._nameserver is None:
            raise ValueError("cluster status comes from a nameserver; this Admin was given brokers")
        return await self._ask_nameserver(RequestCode.CLUSTER_STATUS)

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

    # --- users and ACLs (super users; the nameserver stores them in etcd) ----------------------

    async def put_user(self, name: str, password: str, *, role: str = "normal") -> None:
        """Create ``name`` or replace its password and role. Only a salted SCRAM verifier computed
        here leaves this process, never the password."""
        check_user_name(name)
        credential = Credential.for_password(password)
        await self._ask_nameserver(RequestCode.USER_PUT, {"name": name, "role": role,
                                                    "credential": credential.to_json()})

    async def delete_user(self, name: str) -> bool:
        """False if there was no such user. Its open connections stay authenticated until closed."""
        return bool((await self._ask_nameserver(RequestCode.USER_DELETE, {"name": name}))["deleted"])

    async def users(self) -> list[dict[str, str]]:
        """Every user's ``name`` and ``role`` (brokers' own identities not included)."""
        return list((await self._ask_nameserver(RequestCode.USER_LIST))["users"])

    async def add_acl(self, rule: AclRule) -> bool:
        """False if the same rule was there already; in force on every broker within a second."""
        return bool((await self._ask_nameserver(RequestCode.ACL_ADD, {"acl": dataclasses.asdict(rule)}))["added"])

    async def remove_acl(self, rule: AclRule) -> bool:
        """False if there was no such rule."""
        return bool((await self._ask_nameserver(RequestCode.ACL_REMOVE, {"acl": dataclasses.asdict(rule)}))["removed"])

    async def acls(self) -> list[AclRule]:
        return [AclRule(**fields) for fields in (await self._ask_nameserver(RequestCode.ACL_LIST))["acls"]]

    async def cancel_scheduled(self, msg_id: str) -> None:
        """Recall the scheduled message ``msg_id`` before its time (the id ``send`` returned).
        MessageNotFoundError if it was delivered or cancelled already."""
        located = decode_msg_id(msg_id)
        await self._runtime.pool.request(
            located.address, RequestCode.CANCEL_SCHEDULED, {"phys_offset": located.phys_offset})

    async def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message a message id points at: asked of the broker the id names, else (that broker
        is gone, or no longer holds it) of every live broker, where a replica that copied it from
        that broker answers (docs/replication.md)."""
        located = decode_msg_id(msg_id)
        try:
            frame = await self._runtime.pool.request(
                located.address, RequestCode.VIEW_MESSAGE_BY_ID, {"phys_offset": located.phys_offset})
        except (*UNREACHABLE_ERRORS, MessageNotFoundError) as err:
            frame = await self._replica_copy(located, err)
        return ReceivedMessage(memoryview(frame.body), 0, msg_id_prefix(located.address))

    async def _replica_copy(self, located: MessageId, cause: GmsError) -> Frame:
        """A replica's copy of the message ``located`` names (``cause``: why its broker did not answer)."""
        fields = {"phys_offset": located.phys_offset, "origin": located.address}
        live = await self.brokers()
        others = [broker for broker in live if broker != located.address]

        async def ask() -> list[Frame | BaseException]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, RequestCode.VIEW_MESSAGE_BY_ID, fields) for b in others),
                return_exceptions=True))
        for answer in await ask():
            if isinstance(answer, Frame):
                return answer
        if located.address not in live and isinstance(cause, UNREACHABLE_ERRORS):
            raise ServiceUnavailableError(
                f"the message id names broker {located.address}, which is not a live broker of this cluster"
                f" (live: {', '.join(live) or 'none'}), and no live broker holds a copy: the id may come from"
                " another cluster (check --nameserver / GMS_NAMESERVER), or its broker is down") from cause
        raise cause

    async def find_by_key(self, topic: str, key: str, *, begin_ms: int | None = None, end_ms: int | None = None,
                          max_messages: int = 32) -> list[ReceivedMessage]:
        """The newest ``max_messages`` messages of ``topic`` carrying ``key`` (stored in
        [begin_ms, end_ms], ms, inclusive; None: unbounded), oldest first. Each broker leading
        queues of the topic answers from its key index; its answers for those queues are kept
        (a follower's copies would repeat them). TopicNotFoundError for an unknown topic."""
        routes = await self._runtime.routes.routes(topic)
        led: dict[str, set[int]] = defaultdict(set)
        for route in routes:
            led[route.broker].add(route.queue_id)
        fields: dict[str, Any] = {"topic": topic, "key": key, "max_messages": max_messages}
        if begin_ms is not None:
            fields["begin_ms"] = begin_ms
        if end_ms is not None:
            fields["end_ms"] = end_ms
        brokers = list(led)

        async def ask() -> list[Any]:
            return list(await asyncio.gather(
                *(self._runtime.pool.request(b, RequestCode.FIND_BY_KEY, fields) for b in brokers)))
        found: dict[int, ReceivedMessage] = {}
        for broker, frame in zip(brokers, await ask(), strict=True):
            for message in decode_pull_body(frame.body, msg_id_prefix(broker), MATCH_ALL):
                if message.queue_id in led[broker]:
                    found.setdefault(message.queue_id << 48 | message.queue_offset, message)
        ordered = sorted(found.values(), key=lambda m: (m.store_timestamp_ms, m.queue_id, m.queue_offset))
        return ordered[-max_messages:]

    # --- transactions ----------------------------------------------------------------------------

    async def list_transactions(self) -> list[dict[str, Any]]:
        """The open transactions, oldest first: each broker's part of a transaction (on the queues
        it leads) as a row with ``tx_id``, ``group``, ``queues`` ([topic, queue id, messages]),
        ``messages``, ``age_ms``, ``checks``, ``state`` and ``broker``. Unreachable brokers are
        left out."""
        brokers = await self.brokers()
        rows = []
        for broker, answer in zip(brokers, await self._ask(brokers, RequestCode.LIST_TRANSACTIONS, errors=True),
                                  strict=True):
            if not isinstance(answer, BaseException):
                rows += [{**row, "queues": [decode(TransactionQueue, q, "queues") for q in row["queues"]],
                          "broker": broker} for row in answer["transactions"] if row["leader"]]
        return sorted(rows, key=lambda row: -row["age_ms"])

    async def end_transaction(self, tx_id: str, *, commit: bool) -> list[str]:
        """Commit or roll back an open transaction by hand (what its producer's checker would
        answer): every broker leading some of its queues applies it. The brokers that did;
        TransactionNotFoundError when none holds it."""
        brokers = await self.brokers()
        fields = {"tx_id": tx_id, "commit": commit, "acks": -1 if self._nameserver is not None else 1}
        answers = await self._ask(brokers, RequestCode.END_TRANSACTION, fields, errors=True)
        applied = [b for b, a in zip(brokers, answers, strict=True) if not isinstance(a, BaseException)]
        if applied:
            return applied
        decided = [a for a in answers if isinstance(a, TransactionNotFoundError) and a.fields.get("state")]
        if decided:
            raise decided[0]
        raise TransactionNotFoundError(f"no broker holds an open transaction {tx_id}")

    async def trace(self, msg_id: str, *, trace_topic: str = TRACE_TOPIC, max_records: int = TRACE_RECORDS_MAX,
                    ) -> list[TraceEvent]:
        """The life of the message ``msg_id`` as its traced clients recorded it (docs/traces.md),
        in time order: send and store, deliveries, retries, dead letter, acks. [] when nothing
        was traced (tracing off, or no trace topic). ValueError for a malformed id."""
        decode_msg_id(msg_id)
        try:
            found = await self.find_by_key(trace_topic, region_key(msg_id), max_messages=max_records)
        except TopicNotFoundError:
            return []
        events = [event for record in found for event in decode_events(record.body, msg_id)]
        if any(event.event == STORE for event in events):
            events = await self._store_times(msg_id, events)
        return ordered(events)

    async def _store_times(self, msg_id: str, events: list[TraceEvent]) -> list[TraceEvent]:
        """Store rows at the message's own store time while it is still there (else the time its
        producer got the answer)."""
        try:
            stored_ms = (await self.view_message(msg_id)).store_timestamp_ms
        except GmsError:
            return events
        sent_us = min((e.time_us for e in events if e.event == "send"), default=0)
        return [e._replace(time_us=max(stored_ms * 1000, sent_us), details={"store_time_ms": stored_ms})
                if e.event == STORE else e for e in events]

    async def aclose(self) -> None:
        await self._runtime.aclose()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


P = ParamSpec("P")
R = TypeVar("R")


def _on_loop_thread(method: Callable[Concatenate[AsyncAdmin, P], Coroutine[Any, Any, R]],
                    ) -> Callable[Concatenate[Admin, P], R]:
    """``method`` of the async core, as the synchronous admin's: run on its loop thread."""
    def call(self: Admin, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._runtime.run(method(self._core, *args, **kwargs))
    call.__name__, call.__qualname__, call.__doc__ = method.__name__, f"Admin.{method.__name__}", method.__doc__
    return call


class Admin:
    """Administers a cluster through its nameservers, or a fixed list of brokers: the calls of
    :class:`AsyncAdmin` (see each there), waited for on a loop thread of its own."""

    def __init__(self, brokers: Sequence[str] | str | None = None, *,
                 nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, security: ClientSecurity | None = None) -> None:
        """``security``: TLS and user (None: from ``GMS_TLS_*``, ``GMS_USER``, ``GMS_PASSWORD``)."""
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-admin", security=security)
        self._core = AsyncAdmin._driven(self._runtime)

    brokers = _on_loop_thread(AsyncAdmin.brokers)
    _ask_nameserver = _on_loop_thread(AsyncAdmin._ask_nameserver)
    create_topic = _on_loop_thread(AsyncAdmin.create_topic)
    create_topics = _on_loop_thread(AsyncAdmin.create_topics)
    update_topic = _on_loop_thread(AsyncAdmin.update_topic)
    delete_topic = _on_loop_thread(AsyncAdmin.delete_topic)
    delete_topics = _on_loop_thread(AsyncAdmin.delete_topics)
    topics = _on_loop_thread(AsyncAdmin.topics)
    route = _on_loop_thread(AsyncAdmin.route)
    topic_stats = _on_loop_thread(AsyncAdmin.topic_stats)
    topics_stats = _on_loop_thread(AsyncAdmin.topics_stats)
    broker_status = _on_loop_thread(AsyncAdmin.broker_status)
    cluster_status = _on_loop_thread(AsyncAdmin.cluster_status)
    group_describe = _on_loop_thread(AsyncAdmin.group_describe)
    group_coordinator = _on_loop_thread(AsyncAdmin.group_coordinator)
    groups = _on_loop_thread(AsyncAdmin.groups)
    live_members = _on_loop_thread(AsyncAdmin.live_members)
    reset_offsets = _on_loop_thread(AsyncAdmin.reset_offsets)
    delete_group = _on_loop_thread(AsyncAdmin.delete_group)
    group_settings = _on_loop_thread(AsyncAdmin.group_settings)
    delete_group_settings = _on_loop_thread(AsyncAdmin.delete_group_settings)
    put_user = _on_loop_thread(AsyncAdmin.put_user)
    delete_user = _on_loop_thread(AsyncAdmin.delete_user)
    users = _on_loop_thread(AsyncAdmin.users)
    add_acl = _on_loop_thread(AsyncAdmin.add_acl)
    remove_acl = _on_loop_thread(AsyncAdmin.remove_acl)
    acls = _on_loop_thread(AsyncAdmin.acls)
    cancel_scheduled = _on_loop_thread(AsyncAdmin.cancel_scheduled)
    view_message = _on_loop_thread(AsyncAdmin.view_message)
    find_by_key = _on_loop_thread(AsyncAdmin.find_by_key)
    list_transactions = _on_loop_thread(AsyncAdmin.list_transactions)
    end_transaction = _on_loop_thread(AsyncAdmin.end_transaction)
    trace = _on_loop_thread(AsyncAdmin.trace)

    def set_group_settings(self, group: str, *, create: bool = False, **settings: Any) -> GroupSettings:
        return self._runtime.run(self._core.set_group_settings(group, create=create, **settings))

    set_group_settings.__doc__ = AsyncAdmin.set_group_settings.__doc__

    def close(self) -> None:
        self._runtime.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _member_ids(described: Mapping[str, Any]) -> list[str]:
    return sorted({m["member"] for m in described["members"]})


def _group_not_empty(group: str, members: list[str], action: str) -> GroupNotEmptyError:
    return GroupNotEmptyError(f"cannot {action} of group {group!r} while it has {len(members)} live"
                              f" member(s) (they would commit over it): {', '.join(members)}")


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[start:start + size] for start in range(0, len(items), size)]
