"""What the RocketMQ endpoint needs of gms consumer groups, through gms's own client code: a
group's settings as gms's SimpleConsumer reads them (``load_group_settings``: ``gms group config``
from the nameservers, the defaults without them), and the copy a message becomes in the group's
dead-letter topic (``retry_plan``, ``ensure_topic``, sent with acks=-1 as
``SimpleConsumer.forward_to_dead_letters`` sends it; it also keeps the RocketMQ client's message
id, as RocketMQ does). The caller acknowledges the original.

The client calls block (the SDK's synchronous facade): they run in worker threads, never on the
broker's event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time

from gms.broker.rocketmq.mapping import MESSAGE_ID_PROPERTY
from gms.broker.services.groups import check_group_name
from gms.client.connections import msg_id_prefix
from gms.client.producer import Producer
from gms.client.retries import ensure_topic, load_group_settings, retry_plan
from gms.client.runtime import ClientRuntime
from gms.client.structs import PopBatch, PoppedMessage
from gms.cluster.model import GroupSettings
from gms.record import scan_records
from gms.security.client import ClientSecurity

SETTINGS_CACHED_MAX = 10_000  # groups whose settings are kept; the one read longest ago goes first
SETTINGS_TTL_S = 10.0  # a changed `gms group config` reaches the RocketMQ endpoint this soon
REQUEST_TIMEOUT_MS = 10_000
SEND_RETRIES = 10  # as SimpleConsumer's dead-letter producer


class ConsumerGroups:
    """``brokers`` or ``nameserver``: where the dead-letter topics are (this broker alone, or
    its cluster)."""

    def __init__(self, *, brokers: list[str] | None, nameserver: str | None, security: ClientSecurity) -> None:
        self._brokers = brokers
        self._nameserver = nameserver
        self._security = security
        self._lock = threading.Lock()  # creating the runtime and the producer
        self._runtime: ClientRuntime | None = None
        self._producer: Producer | None = None
        self._settings: dict[str, tuple[float, GroupSettings]] = {}  # group: (read at, settings)

    async def settings(self, group: str) -> GroupSettings:
        """The group's settings, kept SETTINGS_TTL_S (BadRequestError for a name no group may have:
        never cached, never asked of the nameservers)."""
        check_group_name(group)
        found = self._settings.get(group)
        if found is not None and time.monotonic() - found[0] < SETTINGS_TTL_S:
            return found[1]
        settings = await asyncio.to_thread(lambda: load_group_settings(self._client(), group))
        self._settings.pop(group, None)  # to the end: the dict is in the order entries were read
        self._settings[group] = (time.monotonic(), settings)
        if len(self._settings) > SETTINGS_CACHED_MAX:  # clients name groups: never an unbounded cache
            del self._settings[next(iter(self._settings))]
        return settings

    async def dead_letter(self, group: str, record: bytes, broker: str, attempt: int, reason: str) -> str:
        """Store a copy of ``record`` (as popped by ``group``, delivery ``attempt``) in the
        group's dead-letter topic; returns that topic."""
        view = memoryview(record)
        starts = scan_records(view, verify_crc=False).starts  # as gms's PopClient reads a pop answer
        message = PopBatch(view, starts[:1], msg_id_prefix(broker), None, [attempt])[0]
        assert isinstance(message, PoppedMessage)
        settings = await self.settings(group)
        topic, send = retry_plan(message, group, delay_ms=None, reason=reason, delays_ms=settings.retry_delays_ms,
                                 max_reconsume_times=0, attempts=max(attempt, 1))
        if MESSAGE_ID_PROPERTY in message.properties:  # RocketMQ keeps a dead letter's id: so do we
            send["properties"][MESSAGE_ID_PROPERTY] = message.properties[MESSAGE_ID_PROPERTY]

        def store() -> None:
            runtime = self._client()
            runtime.run(ensure_topic(runtime, topic))
            self._dead_letters().send(topic, bytes(message.body), **send)

        await asyncio.to_thread(store)
        return topic

    def _client(self) -> ClientRuntime:
        with self._lock:
            if self._runtime is None:
                self._runtime = ClientRuntime(self._brokers, nameserver=self._nameserver,
                                              request_timeout_ms=REQUEST_TIMEOUT_MS, name="gms-rocketmq-groups",
                                              security=self._security)
            return self._runtime

    def _dead_letters(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self._brokers, nameserver=self._nameserver, security=self._security,
                                          request_timeout_ms=REQUEST_TIMEOUT_MS, acks=-1, retries=SEND_RETRIES)
            return self._producer

    def close(self) -> None:
        """Blocks (closes connections): call from a thread."""
        with self._lock:
            producer, runtime = self._producer, self._runtime
            self._producer = self._runtime = None
        if producer is not None:
            producer.close()
        if runtime is not None:
            runtime.close()
