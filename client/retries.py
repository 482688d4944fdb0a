"""Consumer retries and dead letters (RocketMQ's ``%RETRY%<group>`` / ``%DLQ%<group>``).

A clustering consumer group reads its own retry topic besides its subscription. A message the
application fails (``Consumer.nack``) is sent there as a scheduled message — a copy with
``reconsume_times`` one higher and the original topic and message id in properties — so it comes
back to a member of the same group after a backoff (RocketMQ's schedule: 10 s, 30 s, 1 m, 2 m …
2 h); other groups never see it. Once retried ``max_reconsume_times`` times, its next failure sends
it to the group's dead-letter topic instead, with the reason (``gms dlq``). docs/retries.md says more.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gms.client.routing import NameserverRoutes
from gms.client.runtime import ClientRuntime
from gms.client.structs import ReceivedMessage
from gms.cluster.model import GroupSettings
from gms.errors import GmsError, TopicAlreadyExistsError, TopicNotFoundError
from gms.naming import DLQ_REASON_PROPERTY as DLQ_REASON_PROPERTY  # the SDK's names of the copies' properties
from gms.naming import GROUP_TOPIC_REPLICAS_MAX, SYSTEM_TOPIC_FIELD, copy_properties, dlq_topic, retry_topic
from gms.naming import ORIGIN_MSG_ID_PROPERTY as ORIGIN_MSG_ID_PROPERTY
from gms.naming import ORIGIN_TOPIC_PROPERTY as ORIGIN_TOPIC_PROPERTY
from gms.protocol.codes import RequestCode

log = logging.getLogger(__name__)

REPLICAS_MAX = GROUP_TOPIC_REPLICAS_MAX


def origin_topic(message: ReceivedMessage) -> str:
    """The topic a message was sent to, also for a redelivered one (read from its retry topic)."""
    return message.properties.get(ORIGIN_TOPIC_PROPERTY, message.topic)


async def ensure_topic(runtime: ClientRuntime, topic: str, queues: int = 1) -> None:
    """Create a group's retry or dead-letter topic (or another system topic) unless it exists."""
    routes = runtime.routes
    if isinstance(routes, NameserverRoutes):
        try:
            await routes.request(RequestCode.GET_ROUTE, {"topic": topic})
            return
        except TopicNotFoundError:
            pass
        replicas = max(1, min(REPLICAS_MAX, len(await routes.live_brokers())))
        try:
            await routes.request(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": queues, "replicas": replicas,
                                                            SYSTEM_TOPIC_FIELD: True})
        except TopicAlreadyExistsError:
            pass
        return
    first = routes.brokers[0]  # a fixed list of standalone brokers: the first one holds it
    if topic in (await runtime.pool.request(first, RequestCode.TOPIC_LIST)).fields["topics"]:
        return
    try:
        await runtime.pool.request(first, RequestCode.CREATE_TOPIC,
                                   {"topic": topic, "queues": queues, SYSTEM_TOPIC_FIELD: True})
    except TopicAlreadyExistsError:
        pass


def load_group_settings(runtime: ClientRuntime, group: str) -> GroupSettings:
    """:func:`group_settings` from a synchronous client."""
    return runtime.run(group_settings(runtime, group))


async def group_settings(runtime: ClientRuntime, group: str) -> GroupSettings:
    """The group's settings from the nameservers (gms group config); the defaults when it has
    none, without nameservers, or when they cannot be read (logged: the consumer still works)."""
    routes = runtime.routes
    if not isinstance(routes, NameserverRoutes):
        return GroupSettings()
    try:
        found = (await routes.request(RequestCode.GROUP_SETTINGS_GET, {"group": group})).fields.get("settings")
        return GroupSettings() if found is None else GroupSettings.from_dict(found)
    except GmsError as err:
        log.warning("group %s: cannot read its settings (%s); using the defaults", group, err)
        return GroupSettings()


def retry_delay_ms(delays_ms: Sequence[int], attempt: int) -> int:
    """The backoff after failed attempt ``attempt`` (1: the first; the last delay repeats)."""
    return delays_ms[min(attempt, len(delays_ms)) - 1]


def retry_plan(message: ReceivedMessage, group: str, *, delay_ms: int | None, reason: str,
               delays_ms: Sequence[int], max_reconsume_times: int,
               attempts: int | None = None) -> tuple[str, dict[str, Any]]:
    """(topic, send keyword arguments) of the copy a failed ``message`` becomes: the group's retry
    topic after its backoff, or its dead-letter topic once it failed more than ``max_reconsume_times``
    times (was retried that often).
    ``attempts``: its failures so far, this one included (default: its reconsume_times + 1)."""
    attempts = message.reconsume_times + 1 if attempts is None else attempts
    kept = copy_properties(message.properties, message.topic, message.msg_id)
    send: dict[str, Any] = {"tag": message.tag, "keys": message.keys, "reconsume_times": attempts}
    if attempts > max_reconsume_times:
        return dlq_topic(group), {**send, "properties": {**kept, DLQ_REASON_PROPERTY: reason or "nack"}}
    delay = delay_ms if delay_ms is not None else retry_delay_ms(delays_ms, attempts)
    return retry_topic(group), {**send, "properties": kept, "delay_ms": max(delay, 0)}
