"""Who may do what to which resource: roles first, then the ACLs.

- ``super`` users (by role, or named in ``super_users``) may do everything.
- ``broker`` and ``replica`` principals are services: they may make only their own requests
  (registration, replica fetches), which the servers check by request code, never a client's.
- ``normal`` users: with ACLs off, publish, subscribe and describe anything, administer nothing;
  with ACLs on, exactly what the rules allow (deny beats allow; no matching rule: denied).
- A consumer group's retry and dead-letter topics (``%RETRY%<group>``, ``%DLQ%<group>``) are the
  group's: publishing to, reading or describing them needs subscribe on the group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gms.naming import group_of_topic
from gms.protocol.fields import field
from gms.security.acl import AclTable
from gms.security.gate import forbidden
from gms.security.users import Principal

CLUSTER = "cluster"  # the one cluster resource's name (ACL rules on it have the pattern "*")

Check = tuple[str, str, str]  # (resource type, name, operation)
Policy = Callable[[Mapping[str, Any]], list[Check]]  # what a request (its fields) needs


def on_topic(operation: str) -> Policy:
    """A request naming its topic in field ``topic`` needs ``operation`` on it."""
    return lambda fields: [("topic", field(fields, "topic", str), operation)]


def on_cluster(operation: str) -> Policy:
    return lambda fields: [("cluster", CLUSTER, operation)]


class Authorizer:
    def __init__(self, acls: Callable[[], AclTable] | None, super_users: tuple[str, ...] = ()) -> None:
        """``acls`` gives the current rules (the watch-fed view); None: ACLs are off."""
        self._acls = acls
        self._super_users = frozenset(super_users)

    def is_super(self, principal: Principal) -> bool:
        return principal.role == "super" or (principal.role == "normal" and principal.name in self._super_users)

    def allowed(self, principal: Principal, resource_type: str, name: str, operation: str) -> bool:
        if self.is_super(principal):
            return True
        if principal.role != "normal":
            return False
        if resource_type == "topic" and operation != "admin" and (group := group_of_topic(name)) is not None:
            resource_type, name, operation = "group", group, "subscribe"
        if self._acls is None:
            return operation != "admin"
        return self._acls().decide(principal.name, resource_type, name, operation) is True

    def check(self, principal: Principal, resource_type: str, name: str, operation: str) -> None:
        """Raise ForbiddenError unless ``principal`` may ``operation`` the resource."""
        if not self.allowed(principal, resource_type, name, operation):
            raise forbidden(principal, "the cluster" if resource_type == CLUSTER else f"{resource_type} {name}",
                            operation)

    def check_all(self, principal: Principal, checks: Iterable[Check]) -> None:
        for resource_type, name, operation in checks:
            self.check(principal, resource_type, name, operation)

    def check_super(self, principal: Principal, what: str) -> None:
        if not self.is_super(principal):
            raise forbidden(principal, "the cluster", what, "only super users may")
