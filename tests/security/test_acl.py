"""The ACL model (gms.security.acl): rule validation and codec, and the table's decisions."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.security.acl import (
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    AclRule,
    AclTable,
)

REQUEST_OPS = ("publish", "subscribe", "describe", "admin")


def allow(principal, resource_type, pattern, operation, pattern_type="literal"):
    return AclRule(principal, resource_type, pattern, operation, pattern_type)


def deny(principal, resource_type, pattern, operation, pattern_type="literal"):
    return AclRule(principal, resource_type, pattern, operation, pattern_type, "deny")


# -- decisions ---------------------------------------------------------------------------------
def test_no_rule_is_no_decision_and_other_users_rules_do_not_apply():
    table = AclTable([allow("alice", "topic", "orders", "publish")])
    assert table.decide("alice", "topic", "orders", "publish") is True
    assert table.decide("bob", "topic", "orders", "publish") is None
    assert table.decide("alice", "topic", "orders", "subscribe") is None
    assert table.decide("alice", "topic", "orders2", "publish") is None
    assert table.decide("alice", "group", "orders", "publish") is None
    assert AclTable.EMPTY.decide("alice", "topic", "orders", "publish") is None
    assert AclTable.empty() is AclTable.EMPTY and len(AclTable.EMPTY) == 0


def test_deny_beats_allow_wherever_each_comes_from():
    user_deny = AclTable([allow("alice", "topic", "t", "publish"), deny("alice", "topic", "t", "publish")])
    assert user_deny.decide("alice", "topic", "t", "publish") is False
    everyone_deny = AclTable([allow("alice", "topic", "t", "publish"), deny("*", "topic", "t", "publish")])
    assert everyone_deny.decide("alice", "topic", "t", "publish") is False
    user_over_everyone = AclTable([allow("*", "topic", "*", "all"), deny("alice", "topic", "t", "subscribe")])
    assert user_over_everyone.decide("alice", "topic", "t", "subscribe") is False
    assert user_over_everyone.decide("alice", "topic", "t", "publish") is True
    assert user_over_everyone.decide("bob", "topic", "t", "subscribe") is True
    prefix_deny = AclTable([allow("alice", "topic", "secret-x", "publish"),
                            deny("alice", "topic", "secret", "all", "prefix")])
    assert prefix_deny.decide("alice", "topic", "secret-x", "publish") is False
    wildcard_deny = AclTable([allow("alice", "group", "g", "subscribe"), deny("alice", "group", "*", "subscribe")])
    assert wildcard_deny.decide("alice", "group", "g", "subscribe") is False


def test_wildcard_principal_is_every_user():
    table = AclTable([allow("*", "topic", "news", "subscribe")])
    assert table.decide("alice", "topic", "news", "subscribe") is True
    assert table.decide("bob", "topic", "news", "subscribe") is True
    assert table.decide("bob", "topic", "other", "subscribe") is None


def test_literal_star_is_every_name_of_its_resource_type_only():
    table = AclTable([allow("alice", "topic", "*", "publish")])
    for name in ("a", "orders", "%DLQ%g", "*"):
        assert table.decide("alice", "topic", name, "publish") is True
    assert table.decide("alice", "group", "a", "publish") is None


def test_prefix_patterns():
    table = AclTable([allow("alice", "topic", "orders", "publish", "prefix"),
                      allow("alice", "group", "app.", "subscribe", "prefix")])
    assert table.decide("alice", "topic", "orders", "publish") is True  # the prefix itself
    assert table.decide("alice", "topic", "orders-eu", "publish") is True
    assert table.decide("alice", "topic", "order", "publish") is None
    assert table.decide("alice", "topic", "xorders", "publish") is None
    assert table.decide("alice", "group", "app.billing", "subscribe") is True
    assert table.decide("alice", "group", "app", "subscribe") is None
    assert table.decide("alice", "topic", "app.billing", "subscribe") is None


def test_a_literal_rule_does_not_match_by_prefix():
    table = AclTable([allow("alice", "topic", "orders", "publish")])
    assert table.decide("alice", "topic", "orders-eu", "publish") is None


@pytest.mark.parametrize("operation", ["publish", "subscribe", "admin"])
def test_allow_implies_describe_but_deny_does_not_deny_it(operation):
    assert AclTable([allow("alice", "topic", "t", operation)]).decide("alice", "topic", "t", "describe") is True
    assert AclTable([deny("alice", "topic", "t", operation)]).decide("alice", "topic", "t", "describe") is None
    both = AclTable([allow("alice", "topic", "t", operation), deny("alice", "topic", "t", operation)])
    assert both.decide("alice", "topic", "t", operation) is False
    assert both.decide("alice", "topic", "t", "describe") is True
    # Describe implies nothing else.
    others = set(REQUEST_OPS) - {operation, "describe"}
    table = AclTable([allow("alice", "topic", "t", operation)])
    assert all(table.decide("alice", "topic", "t", op) is None for op in others)
    assert AclTable([allow("alice", "topic", "t", "describe")]).decide("alice", "topic", "t", operation) is None


def test_deny_of_describe_beats_implied_describe():
    table = AclTable([allow("alice", "topic", "t", "publish"), deny("alice", "topic", "t", "describe")])
    assert table.decide("alice", "topic", "t", "describe") is False
    assert table.decide("alice", "topic", "t", "publish") is True


def test_all_is_every_operation():
    allowed = AclTable([allow("alice", "group", "g", "all")])
    assert all(allowed.decide("alice", "group", "g", op) is True for op in REQUEST_OPS)
    denied = AclTable([allow("*", "group", "*", "all"), deny("alice", "group", "g", "all")])
    assert all(denied.decide("alice", "group", "g", op) is False for op in REQUEST_OPS)
    assert all(denied.decide("bob", "group", "g", op) is True for op in REQUEST_OPS)


def test_the_cluster_has_no_name():
    table = AclTable([allow("ops", "cluster", "*", "admin")])
    assert table.decide("ops", "cluster", "", "admin") is True
    assert table.decide("ops", "cluster", "anything", "admin") is True
    assert table.decide("ops", "cluster", "*", "describe") is True
    assert table.decide("ops", "topic", "x", "admin") is None
    with pytest.raises(ValueError, match="cluster has no name"):
        allow("ops", "cluster", "c1", "admin")
    with pytest.raises(ValueError, match="cluster has no name"):
        allow("ops", "cluster", "*", "admin", "prefix")


def test_decide_refuses_what_no_request_needs():
    table = AclTable([allow("alice", "topic", "t", "all")])
    with pytest.raises(ValueError, match="publish, subscribe"):
        table.decide("alice", "topic", "t", "all")
    with pytest.raises(ValueError, match="topic, group, cluster"):
        table.decide("alice", "queue", "t", "publish")


# -- the table as a collection -------------------------------------------------------------------
def test_rules_are_deduplicated_and_listed_in_order():
    rules = [
        allow("bob", "topic", "b", "publish"),
        deny("alice", "topic", "b", "publish"),
        allow("alice", "topic", "b", "publish"),
        allow("alice", "group", "a", "subscribe"),
        allow("ops", "cluster", "*", "admin"),
        allow("alice", "topic", "a", "subscribe", "prefix"),
        allow("alice", "topic", "a", "subscribe"),
    ]
    table = AclTable(rules + rules[:3])
    assert len(table) == len(rules)
    assert table.rules() == [
        allow("ops", "cluster", "*", "admin"),
        allow("alice", "group", "a", "subscribe"),
        allow("alice", "topic", "a", "subscribe"),
        allow("alice", "topic", "a", "subscribe", "prefix"),
        deny("alice", "topic", "b", "publish"),
        allow("alice", "topic", "b", "publish"),
        allow("bob", "topic", "b", "publish"),
    ]
    assert list(table) == table.rules()
    assert table == AclTable(reversed(rules)) and hash(table) == hash(AclTable(reversed(rules)))
    assert table != AclTable.EMPTY


# -- rules: validation, codec, ids ----------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"resource_type": "queue"}, "resource type 'queue' is not one of topic, group, cluster"),
    ({"operation": "write"}, "operation 'write' is not one of publish, subscribe, describe, admin, all"),
    ({"pattern_type": "regex"}, "pattern type 'regex' is not one of literal, prefix"),
    ({"permission": "maybe"}, "permission 'maybe' is not one of allow, deny"),
    ({"principal": "bad name"}, "user name 'bad name'"),
    ({"principal": ""}, "user name ''"),
    ({"pattern": ""}, "non-empty"),
    ({"pattern": "a/b"}, "topic pattern 'a/b'"),
    ({"pattern": ".."}, "topic pattern '..'"),
    ({"pattern": "x" * 128}, "topic pattern"),
    ({"pattern": "a b", "pattern_type": "prefix"}, "topic prefix 'a b'"),
    ({"pattern": "*", "pattern_type": "prefix"}, "prefix pattern cannot be '\\*'"),
    ({"resource_type": "group", "pattern": "g" * 256}, "longer than 255 bytes"),
    ({"operation": None}, "must be a string"),
    ({"pattern": 5}, "must be a string"),
])
def test_invalid_rules_are_refused_saying_why(kwargs, message):
    fields = {"principal": "alice", "resource_type": "topic", "pattern": "orders", "operation": "publish"}
    with pytest.raises(ValueError, match=message):
        AclRule(**{**fields, **kwargs})


def test_patterns_that_are_valid():
    assert allow("alice", "topic", ".", "publish", "prefix").pattern == "."  # '.' alone is no topic, but a prefix
    assert allow("alice", "group", "any group/name é", "subscribe").pattern == "any group/name é"
    assert allow("alice", "group", "g" * 255, "subscribe", "prefix")


def test_describe_is_one_line_for_people():
    prefixed = allow("alice", "topic", "orders", "publish", "prefix")
    assert prefixed.describe() == "allow alice publish topic orders* (prefix)"
    assert deny("*", "group", "billing", "all").describe() == "deny * all group billing"
    assert allow("bob", "topic", "*", "subscribe").describe() == "allow bob subscribe topic *"
    assert allow("ops", "cluster", "*", "admin").describe() == "allow ops admin cluster"


def test_json_is_compact_sorted_and_versioned():
    rule = deny("alice", "topic", "orders", "publish", "prefix")
    assert json.loads(rule.to_json()) == {
        "v": 1, "principal": "alice", "resource_type": "topic", "pattern": "orders",
        "pattern_type": "prefix", "operation": "publish", "permission": "deny",
    }
    assert rule.to_json() == json.dumps(json.loads(rule.to_json()), sort_keys=True, separators=(",", ":")).encode()
    assert AclRule.from_json(rule.to_json().decode()) == rule


@pytest.mark.parametrize("raw", [
    b"", b"[]", b"null", b"\xff",
    b'{"principal":"alice","resource_type":"topic","pattern":"t","pattern_type":"literal","operation":"publish","permission":"allow"}',
    b'{"v":2,"principal":"alice","resource_type":"topic","pattern":"t","pattern_type":"literal","operation":"publish","permission":"allow"}',
    b'{"v":1,"principal":"alice","resource_type":"topic","pattern":"t","pattern_type":"literal","operation":"publish"}',
    b'{"v":1,"principal":"alice","resource_type":"topic","pattern":"t","pattern_type":"literal","operation":"fly","permission":"allow"}',
    b'{"v":1,"principal":["alice"],"resource_type":"topic","pattern":"t","pattern_type":"literal","operation":"publish","permission":"allow"}',
])
def test_from_json_refuses_anything_but_a_valid_rule(raw):
    with pytest.raises(ValueError):
        AclRule.from_json(raw)


def test_rule_id_is_stable_across_processes_and_versions():
    # Stored keys are named by it: changing how it is computed would orphan every stored rule.
    assert allow("alice", "topic", "orders", "publish", "prefix").rule_id == "e29a3603656a14d6"
    assert allow("alice", "topic", "orders", "publish").rule_id == allow("alice", "topic", "orders", "publish").rule_id


def test_rule_id_changes_with_every_field():
    base = {"principal": "alice", "resource_type": "topic", "pattern": "orders", "operation": "publish",
            "pattern_type": "literal", "permission": "allow"}
    variants = [base] + [{**base, name: value} for name, value in [
        ("principal", "bob"), ("principal", "*"), ("resource_type", "group"), ("pattern", "orders2"),
        ("operation", "all"), ("pattern_type", "prefix"), ("permission", "deny"),
    ]]
    ids = {AclRule(**v).rule_id for v in variants}
    assert len(ids) == len(variants)
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


# -- properties --------------------------------------------------------------------------------
PRINCIPALS = ("alice", "bob", "*")
NAMES = ("a", "ab", "abc", "b", "ba")


@st.composite
def rules(draw):
    resource_type = draw(st.sampled_from(RESOURCE_TYPES))
    if resource_type == "cluster":
        pattern, pattern_type = "*", "literal"
    else:
        pattern_type = draw(st.sampled_from(PATTERN_TYPES))
        names = NAMES if pattern_type == "prefix" else (*NAMES, "*")
        pattern = draw(st.sampled_from(names))
    return AclRule(draw(st.sampled_from(PRINCIPALS)), resource_type, pattern, draw(st.sampled_from(OPERATIONS)),
                   pattern_type, draw(st.sampled_from(PERMISSIONS)))


def reference_decide(rules_, user, resource_type, name, operation):
    """The semantics written as a scan of every rule."""
    def matches(r):
        if r.principal not in (user, "*") or r.resource_type != resource_type:
            return False
        if resource_type == "cluster":
            return True
        if r.pattern_type == "prefix":
            return name.startswith(r.pattern)
        return r.pattern in (name, "*")

    matching = [r for r in rules_ if matches(r)]
    if any(r.permission == "deny" and r.operation in (operation, "all") for r in matching):
        return False
    implied = operation == "describe"
    if any(r.permission == "allow" and (r.operation in (operation, "all") or
                                        (implied and r.operation in ("publish", "subscribe", "admin")))
           for r in matching):
        return True
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(rules(), max_size=12), st.sampled_from(("alice", "bob", "carol")),
       st.sampled_from(RESOURCE_TYPES), st.sampled_from(NAMES), st.sampled_from(REQUEST_OPS))
def test_table_decides_as_a_scan_of_every_rule_would(rules_, user, resource_type, name, operation):
    assert AclTable(rules_).decide(user, resource_type, name, operation) == reference_decide(
        rules_, user, resource_type, name, operation)


@given(rules())
def test_json_round_trip_keeps_the_rule_and_its_id(rule):
    back = AclRule.from_json(rule.to_json())
    assert back == rule and back.rule_id == rule.rule_id
