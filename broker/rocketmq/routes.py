"""Where a topic's queues are served to RocketMQ clients.

A RocketMQ client asks one endpoint for a topic's route and then sends to and receives from the
broker each queue names. A gms broker answers with the cluster's route as the nameservers serve
it (its etcd-fed view, no I/O): every queue at its leader's RocketMQ endpoint, as the leader
registered it (``BrokerInfo.rocketmq``). Queues whose leader serves no RocketMQ endpoint (or is
down) are left out: a client could not reach them. A broker without nameservers serves only its
own queues, at its own endpoint. What a topic accepts (its message type) comes from the same
place: the topic's settings in the view, or a lone broker's own topic table.

A topic is used the moment its creation returns, but the view hears of it through etcd's watch
and the broker takes its queues on its event loop a moment later (seconds after a burst of
creations on a busy host). A RocketMQ client's three quick attempts would all find it missing, so
the endpoint waits for it (:func:`topic_arrival`) rather than answering TOPIC_NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gms.cluster.errors import EtcdUnavailable
from gms.errors import TopicNotFoundError

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

# How often a topic on its way is looked for: the view and the broker's assignment change on
# other threads and tasks; this polling runs only for a topic etcd has and this broker does not yet.
ARRIVAL_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class ServedQueue:
    queue_id: int
    broker: str  # the leader's broker id (RocketMQ's broker name)
    endpoint: str  # host:port of the leader's RocketMQ endpoint


def served_queues(broker: BrokerServer, topic: str, endpoint: str) -> list[ServedQueue]:
    """``topic``'s queues a RocketMQ client can use, by queue id (TopicNotFoundError: no such topic)."""
    registration = broker.registration
    if registration is None:
        return [ServedQueue(queue_id, broker.name, endpoint) for queue_id in broker.queues_led(topic)]
    leaders = {info.address: info for info in registration.live_brokers() if info.rocketmq}
    queues = []
    for queue in registration.route(topic).queues:
        info = leaders.get(queue.leader_address or "")
        if info is not None:
            queues.append(ServedQueue(queue.queue_id, info.broker_id, info.rocketmq))
    return queues


def topic_message_type(broker: BrokerServer, topic: str) -> str | None:
    """``topic``'s message type (gms.cluster.model.TOPIC_MESSAGE_TYPES; None: mixed)."""
    registration = broker.registration
    if registration is None:
        return broker.store.topic_limits(topic).message_type
    return registration.topic(topic).settings.message_type


async def topic_arrival(broker: BrokerServer, topic: str, timeout_s: float, *, led_here: bool) -> None:
    """Return once the cluster's view holds ``topic`` and, with ``led_here``, this broker leads a
    queue of it wherever the view names it leader (it has applied the topic's assignment); at once
    for a topic etcd does not hold either, or a lone broker (it creates topics in place), and
    after ``timeout_s`` regardless: the caller then answers what it finds."""
    registration = broker.registration
    if registration is None or not _arriving(broker, topic, led_here):
        return
    if not registration.has_topic(topic):
        try:  # one etcd read tells a topic on its way from one that does not exist
            if not await asyncio.to_thread(registration.topic_in_etcd, topic):
                return
        except EtcdUnavailable as err:
            log.debug("cannot ask etcd about topic %s (%s): answering from the view", topic, err)
            return
    deadline = time.monotonic() + timeout_s
    while _arriving(broker, topic, led_here) and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(ARRIVAL_POLL_S, left))


def _arriving(broker: BrokerServer, topic: str, led_here: bool) -> bool:
    """Whether ``topic`` is not yet as the cluster made it: not in the view, or (``led_here``)
    routed to this broker's leadership but not led here. A send to a queue led here costs one
    look at the broker's own queues."""
    registration = broker.registration
    assert registration is not None
    if led_here:
        try:
            if broker.queues_led(topic):
                return False
        except TopicNotFoundError:
            pass
    try:
        route = registration.route(topic)
    except TopicNotFoundError:
        return True
    return led_here and any(queue.leader_address == broker.address for queue in route.queues)
