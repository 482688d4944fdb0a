"""What each broker request needs, checked before its handler runs (when authentication is on).

The map from request code to (resource, operation) is the broker's access policy:

========================================  ==========================================
SEND, SEND_BATCH                          publish on every topic in the batch (checked
                                          as the store admits the batch: nothing is
                                          stored when one topic is refused)
PULL                                      subscribe on the topic (and on the group)
FETCH                                     subscribe on the group (if any) and on each
                                          topic (checked by the handler: a forbidden
                                          topic fails its queues' rows alone)
POP_MESSAGE, ACK_MESSAGE, CHANGE_INVIS.   subscribe on the topic and on the group
QUERY_*_OFFSET, TOPIC_STATS               describe on the topic (each topic TOPIC_STATS names)
VIEW_MESSAGE_BY_ID                        subscribe on the message's topic
FIND_BY_KEY                               subscribe on the topic
CANCEL_SCHEDULED                          publish on the message's topic
END_TRANSACTION                           publish on the transaction's topics
CHECK_TRANSACTIONS                        answers only transactions whose topics the
                                          principal may publish to
LIST_TRANSACTIONS                         describe on the cluster
HEARTBEAT                                 subscribe on the group and every topic
COMMIT/FETCH_OFFSET, UNREGISTER, RESET    subscribe on the group (describe on topics)
GET_CONSUMER_GROUP_MEMBERS, FIND_COORD.   describe on the group
DELETE_GROUP, DELETE_OFFSETS              admin on the group
CREATE/UPDATE/DELETE_TOPIC                admin on the topic
CREATE_TOPICS                             admin on every topic it names
TOPIC_LIST, BROKER_STATUS                 describe on the cluster
REPLICA_FETCH, OFFSET_FOR_LEADER_EPOCH,   the replica principal of the very broker named
REPLICA_COMPACTED                         in ``replica`` (a broker's own identity); nobody else
COMMIT/FETCH_OFFSET, DELETE_GROUP,        also a ``broker`` credential: a coordinator acting at
DELETE_OFFSETS, BROKER_STATUS             the other brokers for clients it authorised
========================================  ==========================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gms.broker.group_handlers import group_name_field
from gms.errors import BadRequestError
from gms.protocol.codes import RequestCode
from gms.protocol.fields import field
from gms.protocol.frame import Frame
from gms.protocol.groups import QueueOffset, QueueRef, queue_offsets, queue_refs
from gms.protocol.topic_batch import topic_entries
from gms.security.authorizer import Authorizer, Check, Policy, on_cluster, on_topic
from gms.security.gate import current_principal, forbidden
from gms.security.users import Principal

REPLICA_CODES = frozenset({RequestCode.REPLICA_FETCH, RequestCode.OFFSET_FOR_LEADER_EPOCH,
                           RequestCode.REPLICA_COMPACTED})
# What a group's coordinator asks of the other brokers for the clients it serves and authorised
# (a Kafka consumer's commits and committed offsets at each queue's leader, a group's deletion, the
# groups each broker knows): a ``broker`` credential may ask them.
PEER_CODES = frozenset({RequestCode.COMMIT_OFFSET, RequestCode.FETCH_OFFSET, RequestCode.DELETE_GROUP,
                        RequestCode.DELETE_OFFSETS, RequestCode.BROKER_STATUS})


def _group(operation: str) -> Policy:
    return lambda fields: [("group", group_name_field(fields), operation)]


def _pull(fields: Mapping[str, Any]) -> list[Check]:
    checks = [("topic", field(fields, "topic", str), "subscribe")]
    if field(fields, "group", str, ""):
        checks.append(("group", group_name_field(fields), "subscribe"))
    return checks


def _fetch(fields: Mapping[str, Any]) -> list[Check]:
    """The group's only: each topic is checked by the handler, a forbidden one fails its queues alone."""
    return [("group", group_name_field(fields), "subscribe")] if field(fields, "group", str, "") else []


def _topic_and_group(fields: Mapping[str, Any]) -> list[Check]:
    return [("topic", field(fields, "topic", str), "subscribe"), ("group", group_name_field(fields), "subscribe")]


def _heartbeat(fields: Mapping[str, Any]) -> list[Check]:
    subscription = field(fields, "subscription", dict)
    if not all(isinstance(topic, str) for topic in subscription):
        raise BadRequestError("subscription must map topic names to tag expressions")
    return [("group", group_name_field(fields), "subscribe"), *(("topic", t, "subscribe") for t in subscription)]


def _topic_or_topics(action: str) -> Policy:
    """``action`` on the request's ``topic``, or on each of its ``topics``."""
    def checks(fields: Mapping[str, Any]) -> list[Check]:
        if "topics" not in fields:
            return on_topic(action)(fields)
        return [check for entry in topic_entries(fields) for check in on_topic(action)(entry)]
    return checks


def _group_queues(rows: str, decode: Callable[[Mapping[str, Any], str], Sequence[QueueRef | QueueOffset]]) -> Policy:
    def checks(fields: Mapping[str, Any]) -> list[Check]:
        topics = {row.topic for row in decode(fields, rows)} if rows in fields else set()
        return [("group", group_name_field(fields), "subscribe"), *(("topic", t, "describe") for t in sorted(topics))]
    return checks


POLICY: dict[int, Policy] = {
    RequestCode.PULL: _pull,
    RequestCode.FETCH: _fetch,
    RequestCode.POP_MESSAGE: _topic_and_group,
    RequestCode.ACK_MESSAGE: _topic_and_group,
    RequestCode.CHANGE_INVISIBLE_DURATION: _topic_and_group,
    RequestCode.QUERY_MIN_OFFSET: on_topic("describe"),
    RequestCode.QUERY_MAX_OFFSET: on_topic("describe"),
    RequestCode.QUERY_OFFSET_BY_TIME: on_topic("describe"),
    RequestCode.TOPIC_STATS: _topic_or_topics("describe"),
    RequestCode.FIND_BY_KEY: on_topic("subscribe"),
    RequestCode.HEARTBEAT: _heartbeat,
    RequestCode.UNREGISTER_CONSUMER: _group("subscribe"),
    RequestCode.COMMIT_OFFSET: _group_queues("offsets", queue_offsets),
    RequestCode.FETCH_OFFSET: _group_queues("queues", queue_refs),
    RequestCode.RESET_OFFSETS: _group_queues("offsets", queue_offsets),
    RequestCode.GET_CONSUMER_GROUP_MEMBERS: _group("describe"),
    RequestCode.FIND_COORDINATOR: _group("describe"),
    RequestCode.DELETE_GROUP: _group("admin"),
    RequestCode.DELETE_OFFSETS: _group("admin"),
    RequestCode.CREATE_TOPIC: on_topic("admin"),
    RequestCode.CREATE_TOPICS: lambda fields: [check for entry in topic_entries(fields)
                                               for check in on_topic("admin")(entry)],
    RequestCode.UPDATE_TOPIC: on_topic("admin"),
    RequestCode.DELETE_TOPIC: on_topic("admin"),
    RequestCode.TOPIC_LIST: on_cluster("describe"),
    RequestCode.BROKER_STATUS: on_cluster("describe"),
    RequestCode.LIST_TRANSACTIONS: on_cluster("describe"),
}
# Checked by their handlers, which know the topics only once the records are parsed or read.
IN_HANDLER = frozenset({RequestCode.SEND, RequestCode.SEND_BATCH, RequestCode.VIEW_MESSAGE_BY_ID,
                        RequestCode.CANCEL_SCHEDULED, RequestCode.END_TRANSACTION,
                        RequestCode.CHECK_TRANSACTIONS})


class BrokerAccess:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def authorize(self, principal: Principal, frame: Frame) -> None:
        """The listener's hook: raise ForbiddenError unless ``principal`` may make ``frame``."""
        code = frame.code
        if code in REPLICA_CODES or principal.role == "replica":
            self._check_replica(principal, frame)
            return
        if principal.role == "broker" and code in PEER_CODES:
            return
        policy = POLICY.get(code)
        if policy is not None:
            self.authorizer.check_all(principal, policy(frame.fields))
        elif code not in IN_HANDLER and not self.authorizer.is_super(principal):
            raise forbidden(principal, f"request code {code}", "send", "only super users may make it")

    @staticmethod
    def _check_replica(principal: Principal, frame: Frame) -> None:
        claimed = frame.fields.get("replica")
        if frame.code not in REPLICA_CODES:
            raise forbidden(principal, f"request code {frame.code}", "send", "a broker's replica identity may only"
                            " fetch as that broker")
        if principal.broker_id is None or (
                frame.code != RequestCode.OFFSET_FOR_LEADER_EPOCH and claimed != principal.broker_id):
            raise forbidden(principal, f"replica {claimed}", "fetch as",
                            "only that broker's own identity may fetch as a replica")

    def check_topics(self, operation: str) -> Callable[[list[tuple[str, int]]], None]:
        """A store ``admit`` hook refusing a batch with a topic the current principal may not
        ``operation`` (the principal of the request being handled)."""
        principal = current_principal.get()
        authorizer = self.authorizer

        def admit(queues: list[tuple[str, int]]) -> None:
            if principal is None:
                return
            for topic in {topic for topic, _ in queues}:
                authorizer.check(principal, "topic", topic, operation)
        return admit

    def check_topic(self, topic: str, operation: str) -> None:
        principal = current_principal.get()
        if principal is not None:
            self.authorizer.check(principal, "topic", topic, operation)
