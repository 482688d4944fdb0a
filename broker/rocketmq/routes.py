"""Where a topic's queues are served to RocketMQ clients.

A RocketMQ client asks one endpoint for a topic's route and then sends to and receives from the
broker each queue names. A gms broker answers with the cluster's route as the nameservers serve
it (its etcd-fed view, no I/O): every queue at its leader's RocketMQ endpoint, as the leader
registered it (``BrokerInfo.rocketmq``). Queues whose leader serves no RocketMQ endpoint (or is
down) are left out: a client could not reach them. A broker without nameservers serves only its
own queues, at its own endpoint. What a topic accepts (its message type) comes from the same
place: the topic's settings in the view, or a lone broker's own topic table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer


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
