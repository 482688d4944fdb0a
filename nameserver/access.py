"""What each nameserver request needs (when authentication is on).

=============================================  ===========================================
GET_ROUTE                                      describe on the topic
GET_BROKER_LIST                                any authenticated user (clients find group
                                               coordinators through it; routes name brokers too)
TOPIC_LIST, CLUSTER_STATUS                     describe on the cluster
CREATE/UPDATE/DELETE_TOPIC                     admin on the topic (creating a group's retry or
                                               dead-letter topic: subscribe on the group)
CREATE_TOPICS                                  as CREATE_TOPIC, on every topic it names (one
                                               refused refuses the request)
GROUP_SETTINGS_PUT / _DELETE                   admin on the group
GROUP_SETTINGS_GET                             describe on the group (its consumers read it)
INIT_PRODUCER_ID                               any authenticated user (an idempotent producer's id)
a topic change with ``acting_for``             a ``broker`` credential, and then what the change
  ([name, role])                               needs of that user: a broker's Kafka API making
                                               the change for the client it authenticated
REGISTER_BROKER (answers etcd's endpoints)     a ``broker`` credential or a super user
USER_* and ACL_*                               super users only
=============================================  ===========================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.naming import group_of_topic
from gms.protocol.codes import RequestCode
from gms.protocol.fields import field
from gms.protocol.frame import Frame
from gms.protocol.topic_batch import topic_entries
from gms.security.authorizer import Authorizer, Check, Policy, on_cluster, on_topic
from gms.security.gate import forbidden
from gms.security.users import Principal


def _create_topic(topic: str) -> list[Check]:
    """Consumers create their group's retry and dead-letter topics themselves (as RocketMQ's do)."""
    group = group_of_topic(topic)
    return [("group", group, "subscribe")] if group is not None else [("topic", topic, "admin")]


def _create_topics(fields: Mapping[str, Any]) -> list[Check]:
    return [check for entry in topic_entries(fields) for check in _create_topic(field(entry, "topic", str))]


POLICY: dict[int, Policy] = {
    RequestCode.GET_ROUTE: on_topic("describe"),
    RequestCode.TOPIC_LIST: on_cluster("describe"),
    RequestCode.GET_BROKER_LIST: lambda fields: [],
    RequestCode.INIT_PRODUCER_ID: lambda fields: [],
    RequestCode.CLUSTER_STATUS: on_cluster("describe"),
    RequestCode.CREATE_TOPIC: lambda fields: _create_topic(field(fields, "topic", str)),
    RequestCode.CREATE_TOPICS: _create_topics,
    RequestCode.UPDATE_TOPIC: on_topic("admin"),
    RequestCode.DELETE_TOPIC: on_topic("admin"),
    RequestCode.GROUP_SETTINGS_PUT: lambda fields: [("group", field(fields, "group", str), "admin")],
    RequestCode.GROUP_SETTINGS_GET: lambda fields: [("group", field(fields, "group", str), "describe")],
    RequestCode.GROUP_SETTINGS_DELETE: lambda fields: [("group", field(fields, "group", str), "admin")],
}


# The requests a broker may make for the user it authenticated (field ``acting_for``).
ACTING_CODES = frozenset({RequestCode.CREATE_TOPIC, RequestCode.CREATE_TOPICS, RequestCode.UPDATE_TOPIC,
                          RequestCode.DELETE_TOPIC})
ACTING_ROLES = ("normal", "super")


def _acted_for(principal: Principal, frame: Frame) -> Principal:
    """The user a request is held to: ``principal``, or the one a broker names in ``acting_for``."""
    acting = frame.fields.get("acting_for")
    if acting is None:
        return principal
    if principal.role != "broker" or frame.code not in ACTING_CODES:
        raise forbidden(principal, "the cluster", "act for another user in", "only a broker's topic changes may")
    name, role = field(frame.fields, "acting_for", list) + [None, None][len(acting):]
    if not isinstance(name, str) or role not in ACTING_ROLES:
        raise forbidden(principal, "the cluster", f"act for {acting!r} in", "acting_for is [user, normal|super]")
    return Principal(name, role)


class NameserverAccess:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def authorize(self, principal: Principal, frame: Frame) -> None:
        code = frame.code
        if code == RequestCode.REGISTER_BROKER:
            if principal.role != "broker" and not self.authorizer.is_super(principal):
                raise forbidden(principal, "the cluster", "register a broker in", "it needs a broker credential")
            return
        policy = POLICY.get(code)
        if policy is None:
            self.authorizer.check_super(principal, f"make request code {code} to")
            return
        self.authorizer.check_all(_acted_for(principal, frame), policy(frame.fields))
