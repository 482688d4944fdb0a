"""Topic administration and inspection: the small synchronous helper behind scripts and tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gms.errors import GroupNotFoundError
from gms.msgid import decode_msg_id
from gms.protocol.codes import RequestCode

from gms.client.connections import msg_id_prefix
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import ReceivedMessage

DEFAULT_QUEUE_COUNT = 8


class Admin:
    """Administers the given brokers: topics are created on each of them."""

    def __init__(self, brokers: Sequence[str] | str, *, request_timeout_ms: float = REQUEST_TIMEOUT_MS) -> None:
        self._runtime = ClientRuntime(brokers, request_timeout_ms=request_timeout_ms, name="gms-admin")
        self._brokers = self._runtime.routes.brokers

    def _on_all(self, code: int, fields: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async def ask() -> list[Any]:
            frames = await asyncio.gather(*(self._runtime.pool.request(b, code, fields) for b in self._brokers))
            return [dict(f.fields) for f in frames]
        return self._runtime.run(ask())

    def create_topic(self, topic: str, queues: int = DEFAULT_QUEUE_COUNT) -> None:
        self._on_all(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": queues})

    def update_topic(self, topic: str, queues: int) -> None:
        self._on_all(RequestCode.UPDATE_TOPIC, {"topic": topic, "queues": queues})

    def delete_topic(self, topic: str) -> None:
        self._on_all(RequestCode.DELETE_TOPIC, {"topic": topic})

    def topics(self) -> dict[str, int]:
        """Topic name → total queue count over the brokers."""
        merged: dict[str, int] = {}
        for answer in self._on_all(RequestCode.TOPIC_LIST):
            for topic, count in answer["topics"].items():
                merged[topic] = merged.get(topic, 0) + count
        return merged

    def topic_stats(self, topic: str) -> list[dict[str, Any]]:
        """One entry per queue: queue_id, min_offset, max_offset and the broker holding it."""
        stats = []
        for broker, answer in zip(self._brokers, self._on_all(RequestCode.TOPIC_STATS, {"topic": topic})):
            stats.extend({**queue, "broker": broker} for queue in answer["queues"])
        return stats

    def broker_status(self) -> list[dict[str, Any]]:
        return self._on_all(RequestCode.BROKER_STATUS)

    def group_describe(self, group: str) -> dict[str, Any]:
        """Members and committed offsets of ``group``, merged over the brokers that know it."""
        members: list[Any] = []
        offsets: dict[str, dict[str, int]] = {}
        known = False
        for broker in self._brokers:
            try:
                frame = self._runtime.run(self._runtime.pool.request(
                    broker, RequestCode.GET_CONSUMER_GROUP_MEMBERS, {"group": group}))
            except GroupNotFoundError:
                continue
            known = True
            members.extend({**m, "broker": broker} for m in frame.fields["members"])
            for topic, queues in frame.fields["offsets"].items():
                offsets.setdefault(topic, {}).update(queues)
        if not known:
            raise GroupNotFoundError(f"no broker of {self._brokers} knows group {group!r}")
        return {"group": group, "members": members, "offsets": offsets}

    def view_message(self, msg_id: str) -> ReceivedMessage:
        """The message a message id points at (asks the broker the id names)."""
        located = decode_msg_id(msg_id)
        frame = self._runtime.run(self._runtime.pool.request(
            located.address, RequestCode.VIEW_MESSAGE_BY_ID, {"phys_offset": located.phys_offset}))
        return ReceivedMessage(memoryview(frame.body), 0, msg_id_prefix(located.address))

    def close(self) -> None:
        self._runtime.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
