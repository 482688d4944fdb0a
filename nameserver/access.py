"""What each nameserver request needs (when authentication is on).

=============================================  ===========================================
GET_ROUTE                                      describe on the topic
GET_BROKER_LIST                                any authenticated user (clients find group
                                               coordinators through it; routes name brokers too)
TOPIC_LIST, CLUSTER_STATUS                     describe on the cluster
CREATE/UPDATE/DELETE_TOPIC                     admin on the topic (creating a group's retry or
                                               dead-letter topic: subscribe on the group)
REGISTER_BROKER (answers etcd's endpoints)     a ``broker`` credential or a super user
USER_* and ACL_*                               super users only
=============================================  ===========================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gms.naming import group_of_topic
from gms.protocol.codes import RequestCode
from gms.protocol.fields import field
from gms.protocol.frame import Frame
from gms.security.authorizer import CLUSTER, Authorizer
from gms.security.gate import forbidden
from gms.security.users import Principal

Check = tuple[str, str, str]


def _topic(operation: str) -> Callable[[Mapping[str, Any]], list[Check]]:
    return lambda fields: [("topic", field(fields, "topic", str), operation)]


def _cluster_describe(fields: Mapping[str, Any]) -> list[Check]:
    return [("cluster", CLUSTER, "describe")]


def _create_topic(topic: str) -> list[Check]:
    """Consumers create their group's retry and dead-letter topics themselves (as RocketMQ's do)."""
    group = group_of_topic(topic)
    return [("group", group, "subscribe")] if group is not None else [("topic", topic, "admin")]


POLICY: dict[int, Callable[[Mapping[str, Any]], list[Check]]] = {
    RequestCode.GET_ROUTE: _topic("describe"),
    RequestCode.TOPIC_LIST: _cluster_describe,
    RequestCode.GET_BROKER_LIST: lambda fields: [],
    RequestCode.CLUSTER_STATUS: _cluster_describe,
    RequestCode.CREATE_TOPIC: lambda fields: _create_topic(field(fields, "topic", str)),
    RequestCode.UPDATE_TOPIC: _topic("admin"),
    RequestCode.DELETE_TOPIC: _topic("admin"),
}


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
        for resource_type, name, operation in policy(frame.fields):
            self.authorizer.check(principal, resource_type, name, operation)
