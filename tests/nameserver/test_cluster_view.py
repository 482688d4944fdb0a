"""ClusterView follows etcd by watch, survives etcd's death on cached data and recovers."""

import os
import signal
import threading
import time

import pytest
from processes import wait_until

from gms.cluster.cluster_view import ChangeKind, ClusterView, QueueRoute, ViewChange
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.cluster.model import BrokerInfo
from gms.errors import TopicNotFoundError
from gms.nameserver.embedded_etcd import EmbeddedEtcd

SHORT_TTL_S = 2
# A watch delivers within a few ms on loopback; a poller with any sane interval would not.
PROMPT_S = 0.5


class Recorder:
    def __init__(self) -> None:
        self.changes: list[ViewChange] = []
        self.lock = threading.Lock()

    def __call__(self, change: ViewChange) -> None:
        with self.lock:
            self.changes.append(change)

    def saw(self, kind: ChangeKind, name: str) -> bool:
        with self.lock:
            return ViewChange(kind, name) in self.changes


def test_view_follows_changes_promptly_and_routes_from_cache(
    client: EtcdClient, prefix: str, metadata: ClusterMetadata
):
    recorder = Recorder()
    with ClusterView(client, prefix) as view:
        view.subscribe(recorder)
        view.start()
        assert view.healthy and view.brokers() == [] and view.topics() == []
        regs = [
            metadata.register_broker(BrokerInfo(f"b{i}", f"127.0.0.1:{20000 + i}"), ttl_s=SHORT_TTL_S)
            for i in range(2)
        ]
        try:
            assert wait_until(lambda: recorder.saw(ChangeKind.BROKER_UP, "b1"), PROMPT_S) < PROMPT_S
            metadata.create_topic("orders", queue_count=3, replicas=2)
            wait_until(lambda: recorder.saw(ChangeKind.TOPIC_UPDATED, "orders"), PROMPT_S)
            assert view.route("orders").queues == (
                QueueRoute(0, "127.0.0.1:20000", ("127.0.0.1:20000", "127.0.0.1:20001"), 0,
                           ("127.0.0.1:20000", "127.0.0.1:20001")),
                QueueRoute(1, "127.0.0.1:20001", ("127.0.0.1:20001", "127.0.0.1:20000"), 0,
                           ("127.0.0.1:20001", "127.0.0.1:20000")),
                QueueRoute(2, "127.0.0.1:20000", ("127.0.0.1:20000", "127.0.0.1:20001"), 0,
                           ("127.0.0.1:20000", "127.0.0.1:20001")),
            )
            # A broker dying without deregistering drops out of every route within its TTL.
            regs[1].close(deregister=False)
            gone_s = wait_until(lambda: recorder.saw(ChangeKind.BROKER_DOWN, "b1"), SHORT_TTL_S + 1.5)
            assert gone_s <= SHORT_TTL_S + 1.0
            assert [b.broker_id for b in view.brokers()] == ["b0"]
            assert view.route("orders").queues[1] == QueueRoute(1, None, ("127.0.0.1:20000",), 0, ("127.0.0.1:20000",))
            metadata.delete_topic("orders")
            wait_until(lambda: recorder.saw(ChangeKind.TOPIC_DELETED, "orders"), PROMPT_S)
            with pytest.raises(TopicNotFoundError):
                view.route("orders")
        finally:
            for r in regs:
                r.close()


def test_view_starts_from_existing_state(client: EtcdClient, prefix: str, metadata: ClusterMetadata):
    reg = metadata.register_broker(BrokerInfo("b0", "127.0.0.1:1"), ttl_s=SHORT_TTL_S)
    try:
        metadata.create_topic("t", queue_count=2)
        with ClusterView(client, prefix).start() as view:
            assert [q.leader_address for q in view.route("t").queues] == ["127.0.0.1:1"] * 2
            assert view.topic("t").queue_count == 2
    finally:
        reg.close()


def test_topic_state_carries_the_key_mod_revision(client: EtcdClient, prefix: str, metadata: ClusterMetadata):
    """The controller's compare-and-swap revisions come from the view: from the snapshot, then
    from the watch."""
    reg = metadata.register_broker(BrokerInfo("b0", "127.0.0.1:1"), ttl_s=SHORT_TTL_S)
    try:
        metadata.create_topic("t", queue_count=1)
        with ClusterView(client, prefix).start() as view:
            def stored_revision() -> int:
                kv = client.get(metadata.keys.topic("t"))
                assert kv is not None
                return kv.mod_revision

            assert view.topic_state("t") == (view.topic("t"), stored_revision())
            metadata.update_topic("t", queue_count=2)
            wait_until(lambda: view.topic_state("t")[1] == stored_revision(), PROMPT_S)
            assert view.topic_state("t")[0].queue_count == 2 and view.has_topic("t")
            metadata.delete_topic("t")
            wait_until(lambda: not view.has_topic("t"), PROMPT_S)
            with pytest.raises(TopicNotFoundError):
                view.topic_state("t")
    finally:
        reg.close()


def test_etcd_death_keeps_cached_routes_and_recovers(tmp_path):
    etcd = EmbeddedEtcd(tmp_path / "etcd").start()
    port = int(etcd.endpoint.rpartition(":")[2])
    recorder = Recorder()
    try:
        with EtcdClient(etcd.endpoint, timeout_s=1.0) as client:
            metadata = ClusterMetadata(client)
            reg = metadata.register_broker(BrokerInfo("b0", "127.0.0.1:30000"), ttl_s=SHORT_TTL_S)
            metadata.create_topic("t", queue_count=2)
            view = ClusterView(client).start()
            view.subscribe(recorder)
            try:
                route = view.route("t")
                os.kill(etcd.pid, signal.SIGKILL)
                wait_until(lambda: not view.healthy, 2.0)
                assert view.route("t") == route
                assert [b.broker_id for b in view.brokers()] == ["b0"]

                etcd.stop()
                etcd = EmbeddedEtcd(tmp_path / "etcd", client_port=port).start()
                wait_until(lambda: view.healthy, 10.0)
                assert view.route("t") == route
                # The watch is live again: a new topic shows up promptly.
                metadata.create_topic("after", queue_count=1)
                wait_until(lambda: recorder.saw(ChangeKind.TOPIC_UPDATED, "after"), PROMPT_S)
                # The broker's keep-alive carried on against the restarted etcd.
                time.sleep(SHORT_TTL_S + 0.5)
                assert [b.broker_id for b in view.brokers()] == ["b0"] and reg.alive
            finally:
                view.stop()
                reg.close()
    finally:
        etcd.stop()
