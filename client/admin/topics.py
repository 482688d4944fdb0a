"""Topic administration: create, update and delete topics (one or many per round trip), list
them, and their queues' offsets."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from gms.client.admin.base import AdminBase
from gms.errors import (
    GmsError,
    ServiceUnavailableError,
    TopicNotFoundError,
    error_for_status,
)
from gms.protocol.codes import RequestCode, Status
from gms.protocol.topic_batch import CREATE_TOPICS_MAX

DEFAULT_QUEUE_COUNT = 8
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


class TopicAdmin(AdminBase):
    """The topic calls of :class:`~gms.client.admin.AsyncAdmin`."""

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


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[start:start + size] for start in range(0, len(items), size)]
