"""Per-resource access control lists (as Kafka ACLs / RocketMQ ACL 2.0): the rules and their table.

A rule (:class:`AclRule`) allows or denies one *principal* one *operation* on the *resources* its
*pattern* names; :meth:`AclTable.decide` answers a request from all of them:

- ``principal``: a user name, or ``*`` for every authenticated user. A user's own rules and the
  ``*`` rules both apply.
- ``pattern``: a ``literal`` pattern names one topic or group, or is ``*`` for every name of that
  resource type (Kafka's wildcard); a ``prefix`` pattern names every resource whose name starts
  with it. The ``cluster`` resource has no name: its pattern is always the literal ``*``.
- Deny beats allow: any matching deny rule refuses the request, whatever allows it.
- ``all`` in a rule stands for every operation (allowing or denying).
- An *allow* of publish, subscribe or admin also allows describe on the same resources (Kafka's
  implied Describe); a *deny* of those does not deny describe.
- No matching rule: :meth:`AclTable.decide` answers None and the caller applies its default
  (deny, for a secured cluster). Which operation each request needs is the caller's business.

Rules live in etcd under ``<prefix>security/acls/<rule id>`` (gms.cluster.metadata); the id is a
hash of every field, so adding the same rule twice stores it once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import xxhash

from gms.naming import TOPIC_NAME_BYTES_MAX, validate_topic_name
from gms.security.users import check_user_name
from gms.store_errors import InvalidTopicName

RESOURCE_TYPES = ("topic", "group", "cluster")
OPERATIONS = ("publish", "subscribe", "describe", "admin", "all")
PATTERN_TYPES = ("literal", "prefix")
PERMISSIONS = ("allow", "deny")

WILDCARD = "*"  # every authenticated user (principal), every name (literal pattern)
CLUSTER_PATTERN = WILDCARD  # the one pattern a cluster rule has
GROUP_NAME_BYTES_MAX = 255  # as the broker's group handlers accept
ACL_VERSION = 1  # "v" in the stored JSON
_TOPIC_PREFIX = re.compile(rf"[A-Za-z0-9_.%-]{{1,{TOPIC_NAME_BYTES_MAX}}}")

# What a request can ask for (``all`` only appears in rules) and what each rule operation covers.
REQUEST_OPERATIONS = frozenset(op for op in OPERATIONS if op != "all")
_DENIES: dict[str, frozenset[str]] = {op: frozenset({op}) for op in REQUEST_OPERATIONS}
_DENIES["all"] = REQUEST_OPERATIONS
_ALLOWS: dict[str, frozenset[str]] = {op: frozenset({op, "describe"}) for op in REQUEST_OPERATIONS}
_ALLOWS["all"] = REQUEST_OPERATIONS


def _one_of(what: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def _check_pattern(resource_type: str, pattern: str, pattern_type: str) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"a {resource_type} pattern must be a non-empty string, got {pattern!r}")
    if resource_type == "cluster":
        if pattern != CLUSTER_PATTERN or pattern_type != "literal":
            raise ValueError(f"the cluster has no name: its pattern is the literal {CLUSTER_PATTERN!r}, "
                             f"got {pattern_type} {pattern!r}")
        return
    if pattern == WILDCARD:
        if pattern_type != "literal":
            raise ValueError(f"a prefix pattern cannot be {WILDCARD!r}: "
                             f"the literal pattern {WILDCARD!r} names every {resource_type}")
        return
    if resource_type == "topic":
        if pattern_type == "literal":
            try:
                validate_topic_name(pattern)
            except InvalidTopicName as err:
                raise ValueError(f"topic pattern {pattern!r} must be {WILDCARD!r} or a topic name ({err})") from err
        elif not _TOPIC_PREFIX.fullmatch(pattern):
            raise ValueError(f"topic prefix {pattern!r} must be 1..{TOPIC_NAME_BYTES_MAX} "
                             "characters of [A-Za-z0-9_.%-]")
    elif len(pattern.encode()) > GROUP_NAME_BYTES_MAX:
        raise ValueError(f"group pattern {pattern!r} is longer than {GROUP_NAME_BYTES_MAX} bytes")


class _Verdicts(NamedTuple):
    """The request operations that the rules of one key deny and allow."""

    deny: frozenset[str]
    allow: frozenset[str]


@dataclass(frozen=True)
class AclRule:
    """``permission`` ``principal`` ``operation`` on the ``resource_type`` resources ``pattern``
    names (see the module docstring). Fields are checked on construction (ValueError)."""

    principal: str
    resource_type: str
    pattern: str
    operation: str
    pattern_type: str = "literal"
    permission: str = "allow"

    def __post_init__(self) -> None:
        for name in ("principal", "resource_type", "pattern", "operation", "pattern_type", "permission"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"ACL rule field {name} must be a string, got {getattr(self, name)!r}")
        if self.principal != WILDCARD:
            check_user_name(self.principal)
        _one_of("resource type", self.resource_type, RESOURCE_TYPES)
        _one_of("pattern type", self.pattern_type, PATTERN_TYPES)
        _one_of("operation", self.operation, OPERATIONS)
        _one_of("permission", self.permission, PERMISSIONS)
        _check_pattern(self.resource_type, self.pattern, self.pattern_type)

    @property
    def rule_id(self) -> str:
        """16 hex digits, the same for equal rules (whatever process computes them)."""
        return xxhash.xxh64(self._canonical()).hexdigest()

    def _canonical(self) -> bytes:
        fields = [ACL_VERSION, self.principal, self.resource_type, self.pattern_type, self.pattern,
                  self.operation, self.permission]
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()

    @property
    def sort_key(self) -> tuple[str, ...]:
        """Listing order: by resource, then principal, denies before allows."""
        return (self.resource_type, self.pattern, self.pattern_type, self.principal,
                "0" if self.permission == "deny" else "1", self.operation)

    def to_json(self) -> bytes:
        return json.dumps(
            {"v": ACL_VERSION, "principal": self.principal, "resource_type": self.resource_type,
             "pattern": self.pattern, "pattern_type": self.pattern_type, "operation": self.operation,
             "permission": self.permission},
            separators=(",", ":"), sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> AclRule:
        """ValueError if ``raw`` is not a valid rule of this layout version."""
        try:
            data: Any = json.loads(raw)
            if not isinstance(data, dict) or data.get("v") != ACL_VERSION:
                raise ValueError(f"not an ACL rule of version {ACL_VERSION}")
            fields = {name: data[name] for name in ("principal", "resource_type", "pattern", "operation",
                                                    "pattern_type", "permission")}
        except (KeyError, TypeError, UnicodeDecodeError) as err:
            raise ValueError(f"not an ACL rule: {err!r}") from err
        return cls(**fields)

    def describe(self) -> str:
        """One line for people, e.g. ``allow alice publish topic orders* (prefix)``."""
        if self.resource_type == "cluster":
            return f"{self.permission} {self.principal} {self.operation} cluster"
        if self.pattern_type == "prefix":
            return f"{self.permission} {self.principal} {self.operation} {self.resource_type} {self.pattern}* (prefix)"
        return f"{self.permission} {self.principal} {self.operation} {self.resource_type} {self.pattern}"


class AclTable:
    """An immutable set of rules indexed for :meth:`decide`: literal rules by (principal,
    resource type, name), prefix rules by (principal, resource type); a decision is a few dict
    lookups plus a scan of the (short) prefix lists of the user and of ``*``."""

    EMPTY: ClassVar[AclTable]
    __slots__ = ("_literal", "_prefix", "_rules")

    def __init__(self, rules: Iterable[AclRule] = ()) -> None:
        self._rules = tuple(sorted(set(rules), key=lambda r: r.sort_key))
        literal: dict[tuple[str, str, str], list[AclRule]] = {}
        prefix: dict[tuple[str, str], dict[str, list[AclRule]]] = {}
        for rule in self._rules:
            if rule.pattern_type == "literal":
                literal.setdefault((rule.principal, rule.resource_type, rule.pattern), []).append(rule)
            else:
                prefix.setdefault((rule.principal, rule.resource_type), {}).setdefault(rule.pattern, []).append(rule)
        self._literal = {key: _verdicts(rs) for key, rs in literal.items()}
        self._prefix = {key: tuple((p, _verdicts(rs)) for p, rs in by_prefix.items())
                        for key, by_prefix in prefix.items()}

    @classmethod
    def empty(cls) -> AclTable:
        """The table without rules (every decision None); the same as ``AclTable.EMPTY``."""
        return cls.EMPTY

    def decide(self, user: str, resource_type: str, name: str, operation: str) -> bool | None:
        """True if allowed, False if denied, None if no rule speaks about it. ``operation`` is
        what the request needs (not ``all``); for the cluster ``name`` is ignored. Unknown
        resource types or operations are a caller's bug (ValueError)."""
        if operation not in REQUEST_OPERATIONS:
            raise ValueError(f"operation {operation!r} is not one of {', '.join(sorted(REQUEST_OPERATIONS))}")
        if resource_type not in RESOURCE_TYPES:
            raise ValueError(f"resource type {resource_type!r} is not one of {', '.join(RESOURCE_TYPES)}")
        if resource_type == "cluster":
            name = CLUSTER_PATTERN
        allowed = False
        literal, prefix = self._literal, self._prefix
        for principal in (user, WILDCARD) if user != WILDCARD else (WILDCARD,):
            for key in ((principal, resource_type, name), (principal, resource_type, WILDCARD)):
                verdicts = literal.get(key)
                if verdicts is not None:
                    if operation in verdicts.deny:
                        return False
                    allowed = allowed or operation in verdicts.allow
            for pattern, verdicts in prefix.get((principal, resource_type), ()):
                if name.startswith(pattern):
                    if operation in verdicts.deny:
                        return False
                    allowed = allowed or operation in verdicts.allow
        return True if allowed else None

    def rules(self) -> list[AclRule]:
        """Every rule once, in listing order (:attr:`AclRule.sort_key`)."""
        return list(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[AclRule]:
        return iter(self._rules)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AclTable) and self._rules == other._rules

    def __hash__(self) -> int:
        return hash(self._rules)

    def __repr__(self) -> str:
        return f"AclTable({len(self._rules)} rules)"


def _verdicts(rules: Iterable[AclRule]) -> _Verdicts:
    deny: frozenset[str] = frozenset()
    allow: frozenset[str] = frozenset()
    for rule in rules:
        if rule.permission == "deny":
            deny |= _DENIES[rule.operation]
        else:
            allow |= _ALLOWS[rule.operation]
    return _Verdicts(deny, allow)


AclTable.EMPTY = AclTable()
