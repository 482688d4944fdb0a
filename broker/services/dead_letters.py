"""Dead letters: a group's settings (``gms group config``: max delivery attempts, retry delays,
FIFO) and the copy a message the group gave up on becomes in its dead-letter topic
(``%DLQ%<group>``), the copy gms's consumers make (:func:`gms.naming.copy_properties`, the
reason, the attempts as its reconsume times).

The dead-letter topic is created as a consumer creates it (a system topic of one queue: on this
broker when standalone, through the nameservers in a cluster, replicated on up to
GROUP_TOPIC_REPLICAS_MAX brokers), and the copy is stored with acks=-1 on its queue's leader:
this broker, or another one over the broker's own connection to it. Exactly once across retries,
as the SDK's idempotent producer: each copy is stamped as the next batch of this service's own
producer on the queue (a random id, as the SDK's when no nameserver allocates one), the copies of
one topic go one at a time, and a retry sends the same stamped batch to the queue's leader of the
moment, which answers a batch it stored (or replicated) with where it is. The caller acknowledges
the original once the copy is stored.

A copy whose outcome is unknown (its retries ran out while the queue had no reachable leader, as
while a dead leader's lease runs, or its caller was cancelled) may be stored: it stays the
producer's unsure copy, and the next copy of the topic first sends it again, same stamp, so that it
is stored once whenever it was. Its original, not acknowledged, comes back to be moved again: it is
recognised by its queue position and not copied twice (before, the copy was given up and the next
one started a new producer: a copy stored by a leader killed before its answer was stored again).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING

from gms.address import split_address
from gms.broker.services.groups import check_group_name
from gms.broker.services.peers import Peers
from gms.cluster.model import GroupSettings
from gms.errors import (
    GmsError,
    ServiceUnavailableError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnknownProducerIdError,
)
from gms.msgid import encode_msg_id
from gms.naming import (
    DLQ_REASON_PROPERTY,
    GROUP_TOPIC_REPLICAS_MAX,
    SYSTEM_TOPIC_FIELD,
    copy_properties,
    dlq_topic,
)
from gms.protocol.codes import RequestCode
from gms.record import decode_record, encode_record
from gms.record.sequence import BatchSequence, stamp_sequence

if TYPE_CHECKING:
    from gms.broker.registration import BrokerRegistration
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

SETTINGS_CACHED_MAX = 10_000  # groups whose settings are kept; the one read longest ago goes first
SETTINGS_TTL_S = 10.0  # a changed `gms group config` is seen this soon
SEND_ATTEMPTS = 11  # as the SDK's dead-letter producer: a send and 10 retries
RETRY_BACKOFF_S, RETRY_BACKOFF_MAX_S = 0.1, 1.0
ROUTE_WAIT_S = 10.0  # for a new dead-letter topic's leader
SETTLED_MAX = 10_000  # originals remembered whose copy was stored after their move failed

# An original record by its queue position (topic, queue id, queue offset).
_Original = tuple[str, int, int]


class _Producer:
    """This service's idempotent producer on one dead-letter queue: its id and next batch, the
    copy whose outcome is unknown, and the originals whose copy was stored after their move
    failed (see the module docstring)."""

    __slots__ = ("lock", "next", "producer_id", "settled", "unsure")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # one copy in flight
        self.producer_id = secrets.randbits(63)
        self.next = 0
        self.unsure: tuple[_Original, bytearray] | None = None  # stamped as batch `next`
        self.settled: dict[_Original, None] = {}  # oldest first

    def restart(self) -> None:
        self.producer_id, self.next = secrets.randbits(63), 0

    def stamp(self, copy: bytearray) -> None:
        stamp_sequence(copy, BatchSequence(self.producer_id, 0, self.next, 1))

    def settle(self, original: _Original) -> None:
        self.settled[original] = None
        if len(self.settled) > SETTLED_MAX:
            del self.settled[next(iter(self.settled))]


class DeadLetterService:
    def __init__(self, broker: BrokerServer, peers: Peers) -> None:
        self.broker = broker
        self._settings: dict[str, tuple[float, GroupSettings]] = {}  # group: (read at, settings)
        self._producers: dict[str, _Producer] = {}  # dead-letter topic: its producer
        self.peers = peers

    async def settings(self, group: str) -> GroupSettings:
        """The group's settings, kept SETTINGS_TTL_S (the defaults when it has none, standalone,
        or when etcd cannot be read: logged, the consumer still works)."""
        check_group_name(group)
        found = self._settings.get(group)
        if found is not None and time.monotonic() - found[0] < SETTINGS_TTL_S:
            return found[1]
        read: GroupSettings | None = None
        if self.broker.registration is not None:
            try:
                read = await asyncio.to_thread(self._group_settings, group)
            except (GmsError, ValueError) as err:  # etcd away, a malformed value: as a consumer, the defaults
                log.warning("group %s: cannot read its settings (%s); using the defaults", group, err)
        settings = read or GroupSettings()
        self._settings.pop(group, None)  # to the end: the dict is in the order entries were read
        self._settings[group] = (time.monotonic(), settings)
        if len(self._settings) > SETTINGS_CACHED_MAX:  # clients name groups: never an unbounded cache
            del self._settings[next(iter(self._settings))]
        return settings

    def _group_settings(self, group: str) -> GroupSettings | None:
        registration = self.broker.registration
        return None if registration is None else registration.group_settings(group)

    async def dead_letter(self, group: str, record: bytes, attempt: int, reason: str,
                          keep: tuple[str, ...] = ()) -> str:
        """Store the copy of ``record`` (as handed out to ``group``, delivery ``attempt``) in the
        group's dead-letter topic; returns that topic. ``keep``: properties of the record the
        copy keeps although internal (a protocol's own message id)."""
        check_group_name(group)
        original = decode_record(memoryview(record), verify_crc=False)
        host, port = split_address(self.broker.address, "broker address")
        properties = copy_properties(original.properties, original.topic,
                                     encode_msg_id(host, port, original.phys_offset))
        properties[DLQ_REASON_PROPERTY] = reason or "nack"
        properties.update({name: original.properties[name] for name in keep if name in original.properties})
        topic = dlq_topic(group)
        copy = bytearray(encode_record(topic=topic, body=original.body, tag=original.tag, keys=original.keys,
                                       properties=properties, born_host=host, born_ts_ms=int(time.time() * 1000),
                                       reconsume_times=max(attempt, 1)))
        await self._ensure_topic(topic)
        await self._store(topic, (original.topic, original.queue_id, original.queue_offset), copy)
        return topic

    async def _ensure_topic(self, topic: str) -> None:
        """Create the dead-letter topic unless it exists, and wait for its queue's leader."""
        if not self.broker.config.nameserver:  # standalone: on this broker
            if self.broker.store.queue_count(topic) is None:
                try:
                    await self.broker.services.topics.create_topic(topic, 1, {}, system=True)
                except TopicAlreadyExistsError:
                    pass
            return
        registration = self._registration()
        if not registration.has_topic(topic) and not await asyncio.to_thread(registration.topic_in_etcd, topic):
            replicas = max(1, min(GROUP_TOPIC_REPLICAS_MAX, len(registration.live_brokers())))
            try:
                await self.broker.services.topics.nameserver_request(RequestCode.CREATE_TOPIC, {
                    "topic": topic, "queues": 1, "replicas": replicas, SYSTEM_TOPIC_FIELD: True})
            except TopicAlreadyExistsError:
                pass
        deadline = time.monotonic() + ROUTE_WAIT_S
        while self._leader(topic) is None:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(f"the dead-letter topic {topic} has no leader yet")
            await asyncio.sleep(RETRY_BACKOFF_S)

    def _leader(self, topic: str) -> str | None:
        """The address of the leader of the topic's queue 0 (None: not known yet)."""
        if not self.broker.config.nameserver:
            return self.broker.address
        registration = self._registration()
        if not registration.has_topic(topic):
            return None
        queues = registration.route(topic).queues
        return queues[0].leader_address if queues else None

    async def _store(self, topic: str, original: _Original, copy: bytearray) -> None:
        """Store the copy of ``original`` on its queue's leader (see the module docstring), acks=-1."""
        producer = self._producers.setdefault(topic, _Producer())
        async with producer.lock:
            if original in producer.settled:  # its copy was stored after its move failed
                del producer.settled[original]
                return
            if producer.unsure is not None:
                unsure, unsure_copy = producer.unsure
                await self._send_retried(topic, producer, unsure_copy)
                if unsure == original:
                    return
                producer.settle(unsure)
            producer.stamp(copy)
            producer.unsure = (original, copy)  # until its answer: a cancelled send stays unsure too
            await self._send_retried(topic, producer, copy)

    async def _send_retried(self, topic: str, producer: _Producer, copy: bytearray) -> None:
        """Send the producer's unsure copy until it is stored, then number the next one; when the
        leader refuses it for good, give it up (it is not stored) and start a new producer."""
        delay = RETRY_BACKOFF_S
        for attempt in range(SEND_ATTEMPTS):
            try:
                await self._send(topic, copy)
            except UnknownProducerIdError:  # the leader forgot the producer (its state expired):
                producer.restart()  # every earlier copy is stored, so number the queue from 0 again
                producer.stamp(copy)
            except GmsError as err:
                # A topic just created may not have reached its leader yet: retried too.
                if not (err.retriable or isinstance(err, TopicNotFoundError)):
                    producer.unsure = None
                    producer.restart()
                    raise
                if attempt == SEND_ATTEMPTS - 1:
                    raise  # unsure: sent again before the next copy
                log.debug("dead letter to %s: %r; retrying", topic, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_BACKOFF_MAX_S)
            else:
                producer.unsure = None
                producer.next += 1
                return

    async def _send(self, topic: str, copy: bytearray) -> None:
        leader = self._leader(topic)
        if leader is None:
            raise ServiceUnavailableError(f"the dead-letter topic {topic} has no leader now")
        if leader == self.broker.address:
            await self.broker.services.messages.stored(copy, -1)
            return
        await self.peers.request(leader, RequestCode.SEND, {"acks": -1}, bytes(copy))

    def _registration(self) -> BrokerRegistration:
        registration = self.broker.registration
        if registration is None:
            raise ServiceUnavailableError("the broker is not registered with the cluster yet: retry")
        return registration

    def close(self) -> None:
        self.peers.close()
