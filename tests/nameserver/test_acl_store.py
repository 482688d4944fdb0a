"""Access rules in etcd (ClusterMetadata.put_acl / delete_acl / list_acls) and ClusterView.acls()."""

import logging

from processes import wait_until

from gms.cluster.cluster_view import ClusterView
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata, Keys
from gms.security.acl import AclRule, AclTable

PROMPT_S = 1.0  # a watch delivers within milliseconds on loopback

PUBLISH = AclRule("alice", "topic", "orders", "publish", "prefix")
DENY_ALL = AclRule("*", "topic", "orders-secret", "all", permission="deny")
CLUSTER = AclRule("ops", "cluster", "*", "admin")


def test_put_delete_list_report_what_changed(metadata: ClusterMetadata, client: EtcdClient, prefix: str):
    assert metadata.list_acls() == []
    assert metadata.put_acl(PUBLISH) is True
    assert metadata.put_acl(PUBLISH) is False  # the same rule again: idempotent
    assert metadata.put_acl(AclRule("alice", "topic", "orders", "publish", "prefix")) is False
    assert metadata.put_acl(DENY_ALL) is True
    assert metadata.put_acl(CLUSTER) is True
    assert metadata.list_acls() == [CLUSTER, PUBLISH, DENY_ALL] == AclTable([PUBLISH, DENY_ALL, CLUSTER]).rules()
    kv = client.get(f"{prefix}security/acls/{PUBLISH.rule_id}")
    assert kv is not None and AclRule.from_json(kv.value) == PUBLISH
    assert Keys(prefix).acl(PUBLISH.rule_id) == f"{prefix}security/acls/{PUBLISH.rule_id}"
    assert metadata.delete_acl(PUBLISH) is True
    assert metadata.delete_acl(PUBLISH) is False
    assert metadata.delete_acl(AclRule("bob", "group", "g", "subscribe")) is False
    assert metadata.list_acls() == [CLUSTER, DENY_ALL]
    assert metadata.list_users() == []  # a sibling subtree under security/


def test_view_follows_rules_promptly(client: EtcdClient, prefix: str, metadata: ClusterMetadata):
    metadata.put_acl(CLUSTER)  # before the view starts: from its snapshot
    with ClusterView(client, prefix).start() as view:
        first = view.acls()
        assert first.rules() == [CLUSTER] and first.decide("ops", "cluster", "", "admin") is True

        metadata.put_acl(PUBLISH)
        wait_until(lambda: len(view.acls()) == 2, PROMPT_S)
        assert view.acls().decide("alice", "topic", "orders-eu", "publish") is True
        assert view.acls().decide("alice", "topic", "orders-secret", "publish") is True
        assert first.rules() == [CLUSTER]  # a snapshot handed out earlier does not change

        metadata.put_acl(DENY_ALL)
        wait_until(lambda: view.acls().decide("alice", "topic", "orders-secret", "publish") is False, PROMPT_S)

        metadata.delete_acl(PUBLISH)
        wait_until(lambda: view.acls().decide("alice", "topic", "orders-eu", "publish") is None, PROMPT_S)
        assert view.acls().rules() == metadata.list_acls() == [CLUSTER, DENY_ALL]

        # Other changes leave the table as it is (the same object: nothing rebuilt).
        table = view.acls()
        assert metadata.put_acl(CLUSTER) is False
        client.put(f"{prefix}election/x", b"x")
        revision = client.put(f"{prefix}security/users/nobody", b"{}")  # undecodable user: logged
        wait_until(lambda: view.revision >= revision, PROMPT_S)
        assert view.acls() is table
        marker = AclRule("bob", "group", "g", "subscribe")
        metadata.put_acl(marker)
        wait_until(lambda: marker in view.acls().rules(), PROMPT_S)
        assert table.rules() == [CLUSTER, DENY_ALL]

        metadata.delete_acl(marker)
        metadata.delete_acl(CLUSTER)
        metadata.delete_acl(DENY_ALL)
        wait_until(lambda: len(view.acls()) == 0, PROMPT_S)
        assert view.acls() == AclTable.EMPTY


def test_view_skips_undecodable_rules(client: EtcdClient, prefix: str, metadata: ClusterMetadata, caplog):
    keys = Keys(prefix)
    client.put(keys.acl("garbage-at-start"), b"not json")
    metadata.put_acl(PUBLISH)
    with caplog.at_level(logging.ERROR, logger="gms.cluster.cluster_view"), ClusterView(client, prefix).start() as view:
        assert view.acls().rules() == [PUBLISH]
        client.put(keys.acl(PUBLISH.rule_id), b'{"v": 1, "principal": "alice"}')  # a broken rewrite
        wait_until(lambda: len(view.acls()) == 0, PROMPT_S)
        metadata.put_acl(DENY_ALL)
        wait_until(lambda: view.acls().rules() == [DENY_ALL], PROMPT_S)
        assert view.healthy
    messages = [r.getMessage() for r in caplog.records]
    assert any("undecodable ACL rule garbage-at-start" in m for m in messages)
    assert any(f"undecodable ACL rule {PUBLISH.rule_id}" in m for m in messages)
