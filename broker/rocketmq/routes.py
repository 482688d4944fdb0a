"""Where a topic's queues are served to RocketMQ clients.

A RocketMQ client asks one endpoint for a topic's route and then sends to and receives from the
broker each queue names. A gms broker answers with the cluster's route as the nameservers serve
it (:meth:`gms.broker.services.topics.TopicService.leaders`): every queue at its leader's RocketMQ
endpoint, as the leader registered it (``BrokerInfo.rocketmq``). Queues whose leader serves no
RocketMQ endpoint (or is down) are left out: a client could not reach them. A broker without
nameservers serves only its own queues, at its own endpoint. What a topic accepts (its message
type) comes from the topic service too. A topic created a moment ago is waited for
(:meth:`~gms.broker.services.topics.TopicService.arrival`) rather than answered TOPIC_NOT_FOUND:
a RocketMQ client's three quick attempts would all find it missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gms.broker.services.topics import TopicService


@dataclass(frozen=True, slots=True)
class ServedQueue:
    queue_id: int
    broker: str  # the leader's broker id (RocketMQ's broker name)
    endpoint: str  # host:port of the leader's RocketMQ endpoint


def served_queues(topics: TopicService, topic: str, name: str, endpoint: str) -> list[ServedQueue]:
    """``topic``'s queues a RocketMQ client can use, by queue id (TopicNotFoundError: no such
    topic); ``name`` and ``endpoint``: this broker's, where it serves its own queues alone."""
    leaders = topics.leaders(topic)
    if leaders is None:
        return [ServedQueue(queue_id, name, endpoint) for queue_id in topics.queues_led(topic)]
    return [ServedQueue(queue_id, info.broker_id, info.rocketmq) for queue_id, info in leaders if info.rocketmq]
