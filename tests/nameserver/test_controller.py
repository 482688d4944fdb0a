"""The controller against a real embedded etcd. Brokers are plain registrations with a short
lease (no broker process); controllers are in-process candidates, each with its own view."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from processes import wait_until
from test_server_helpers import RunningNameServer

from gms.cluster import metadata as metadata_module
from gms.cluster.cluster_view import ClusterView
from gms.cluster.errors import ControllerFenced
from gms.cluster.etcd_client import CreateRevisionIs, EtcdClient
from gms.cluster.metadata import BrokerRegistration, ClusterMetadata, NewTopic
from gms.cluster.model import BrokerInfo, QueueState, TopicMetadata, TopicSettings
from gms.errors import BadRequestError, TopicNotFoundError
from gms.nameserver.controller import Controller
from gms.nameserver.election import Election
from gms.nameserver.embedded_etcd import EmbeddedEtcd
from gms.protocol.codes import RequestCode as C

TTL_S = 2  # broker and controller leases


class Harness:
    """Brokers and controllers on one prefix; everything is closed at the end."""

    def __init__(self, client: EtcdClient, prefix: str, metadata: ClusterMetadata) -> None:
        self.client, self.prefix, self.metadata = client, prefix, metadata
        self.brokers: dict[str, BrokerRegistration] = {}
        self.controllers: list[Controller] = []
        self.views: list[ClusterView] = []

    def register(self, *broker_ids: str) -> None:
        for i, b in enumerate(broker_ids):
            info = BrokerInfo(b, f"10.0.0.{i + 1}:10911")
            self.brokers[b] = self.metadata.register_broker(info, ttl_s=TTL_S)

    def kill(self, broker_id: str, *, wait_lease: bool = False) -> None:
        """``wait_lease``: as a crash (the key goes when the lease expires), else a clean stop."""
        self.brokers.pop(broker_id).close(deregister=not wait_lease)

    def controller(self, cid: str, before_write: Callable[[str], None] | None = None,
                   on_txn: Callable[[int], None] | None = None) -> Controller:
        view = ClusterView(self.client, self.prefix).start()
        self.views.append(view)
        c = Controller(self.client, view, cid, prefix=self.prefix, ttl_s=TTL_S,
                       before_write=before_write, on_txn=on_txn).start()
        self.controllers.append(c)
        return c

    def queue(self, topic: str, queue_id: int = 0) -> QueueState:
        return self.metadata.get_topic(topic).queues[queue_id]

    def close(self) -> None:
        for c in self.controllers:
            c.close()
        for v in self.views:
            v.stop()
        for r in self.brokers.values():
            r.close()


@pytest.fixture
def h(client: EtcdClient, prefix: str, metadata: ClusterMetadata) -> Iterator[Harness]:
    harness = Harness(client, prefix, metadata)
    yield harness
    harness.close()


def test_broker_lease_loss_moves_every_queue_it_led_within_ttl(h: Harness):
    h.register("b0", "b1", "b2")
    h.metadata.create_topic("t", queue_count=3, replicas=3)
    h.metadata.create_topic("u", queue_count=2, replicas=2)
    c = h.controller("c1")
    wait_until(lambda: c.is_leader, 10)
    h.kill("b1", wait_lease=True)
    killed = time.monotonic()
    took_s = wait_until(lambda: h.queue("t", 1).leader != "b1" and h.queue("u", 1).leader != "b1",
                        TTL_S + 3)
    assert time.monotonic() - killed <= TTL_S + 2, f"failover took {took_s:.2f} s"
    t, u = h.metadata.get_topic("t"), h.metadata.get_topic("u")
    # t/1: replicas (b1, b2, b0) -> the next in-sync replica leads; the dead one leaves the ISR
    assert t.queues[1] == QueueState(1, ("b1", "b2", "b0"), "b2", ("b2", "b0"), 1, c.epoch)
    assert u.queues[1] == QueueState(1, ("b1", "b2"), "b2", ("b2",), 1, c.epoch)
    # queues whose leader lives keep it and its epoch; the dead broker leaves their ISR at once
    # (in the same write), not after the leader's lag window
    assert [q.leader_epoch for q in t.queues] == [0, 1, 0] and u.queues[0].leader_epoch == 0
    assert [q.isr for q in t.queues] == [("b0", "b2"), ("b2", "b0"), ("b2", "b0")]
    assert u.queues[0].isr == ("b0",) and t.queues[0].controller_epoch == c.epoch


def test_failover_of_hundreds_of_queues_is_written_in_batches(h: Harness):
    """A broker leading 300 queues of 150 topics: every queue moves, in a transaction per 127
    topics (etcd's 128 compares: the fence and one per topic), not one per topic."""
    h.register("b0", "b1")
    created = h.metadata.create_topics([NewTopic(f"t{i:03d}", 4, 2) for i in range(150)])
    assert all(isinstance(t, TopicMetadata) for t in created)
    led = {(t.name, q.queue_id) for t in h.metadata.list_topics() for q in t.queues if q.leader == "b0"}
    assert len(led) == 300
    txns: list[int] = []
    c = h.controller("c1", on_txn=txns.append)
    wait_until(lambda: c.is_leader, 10)
    h.kill("b0", wait_lease=True)
    wait_until(lambda: sum(txns) == 150, TTL_S + 10)
    topics = h.metadata.list_topics()
    assert all(q.leader == "b1" and q.isr == ("b1",) for t in topics for q in t.queues)
    assert {(t.name, q.queue_id) for t in topics for q in t.queues if q.leader_epoch == 1} == led
    assert all(q.controller_epoch == c.epoch for t in topics for q in t.queues)
    assert txns == [127, 23]


def test_isr_change_mid_batch_is_not_overwritten(h: Harness):
    """A leader shrinks its ISR while the controller's batch is in flight: the transaction is
    refused, only that topic is read again (and needs no write any more), the others are
    written in the next one; the leader's ISR stands."""
    h.register("b0", "b1", "b2")
    h.metadata.create_topics([NewTopic(f"t{i}", 1, 3) for i in range(10)])  # each led by b0, ISR of 3
    shrunk: list[str] = []

    def shrink_isr_meanwhile(topic: str) -> None:
        if topic == "t9" and not shrunk:  # the batch's last topic: t3's new state is computed
            shrunk.append(topic)
            assert h.metadata.update_isr("t3", 0, leader_id="b0", leader_epoch=0, isr=["b0"])

    txns: list[int] = []
    c = h.controller("c1", shrink_isr_meanwhile, txns.append)
    wait_until(lambda: c.is_leader, 10)
    h.kill("b1")
    wait_until(lambda: sum(txns) == 9, 10)
    assert txns == [0, 9]
    assert h.queue("t3").isr == ("b0",)  # not the controller's (b0, b2)
    for t in h.metadata.list_topics():
        q = t.queues[0]
        assert q.leader == "b0" and q.leader_epoch == 0
        assert (q.isr, q.controller_epoch) == ((("b0",), 0) if t.name == "t3" else (("b0", "b2"), c.epoch))


def test_queue_offline_until_an_isr_member_returns(h: Harness):
    h.register("b0", "b1")
    h.metadata.create_topic("t", queue_count=1, replicas=2)
    assert h.metadata.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0"])
    c = h.controller("c1")
    wait_until(lambda: c.is_leader, 10)
    h.kill("b0")
    wait_until(lambda: h.queue("t").leader_epoch == 1, 10)
    assert h.queue("t") == QueueState(0, ("b0", "b1"), None, ("b0",), 1, c.epoch)
    time.sleep(0.3)
    assert h.queue("t").leader is None  # b1 is alive but out of sync: no unclean election
    h.register("b0")
    wait_until(lambda: h.queue("t").leader == "b0", 10)
    assert h.queue("t") == QueueState(0, ("b0", "b1"), "b0", ("b0",), 2, c.epoch)


def test_unclean_election_chooses_an_out_of_sync_replica(h: Harness):
    h.register("b0", "b1")
    settings = TopicSettings(min_insync_replicas=1, unclean_leader_election=True)
    h.metadata.create_topic("t", queue_count=1, replicas=2, settings=settings)
    assert h.metadata.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0"])
    c = h.controller("c1")
    wait_until(lambda: c.is_leader, 10)
    h.kill("b0")
    wait_until(lambda: h.queue("t").leader_epoch == 1, 10)
    assert h.queue("t") == QueueState(0, ("b0", "b1"), "b1", ("b1",), 1, c.epoch)


def test_offline_queue_found_by_a_newly_elected_controller(h: Harness):
    """No controller while the leader died and came back: the next one repairs on election."""
    h.register("b0", "b1")
    h.metadata.create_topic("t", queue_count=2, replicas=1)
    h.kill("b1")
    c = h.controller("c1")
    wait_until(lambda: h.queue("t", 1).leader_epoch == 1, 10)
    assert h.queue("t", 1).leader is None
    h.register("b1")
    wait_until(lambda: h.queue("t", 1).leader == "b1", 10)
    assert h.queue("t", 1).leader_epoch == 2 and h.queue("t", 0).leader_epoch == 0
    assert c.status().is_self


def test_two_controllers_only_the_elected_one_acts(h: Harness):
    wrote: dict[str, list[str]] = {"c1": [], "c2": []}
    h.register("b0", "b1")
    h.metadata.create_topic("t", queue_count=2, replicas=2)
    c1 = h.controller("c1", wrote["c1"].append)
    wait_until(lambda: c1.is_leader, 10)
    c2 = h.controller("c2", wrote["c2"].append)
    wait_until(lambda: c2.status().controller_id == "c1", 10)
    assert c2.status().epoch == c1.epoch and not c2.status().is_self and not c2.is_leader
    h.kill("b1")
    wait_until(lambda: h.queue("t", 1).leader == "b0", 10)
    time.sleep(0.3)
    assert wrote == {"c1": ["t"], "c2": []}
    assert h.queue("t", 1).controller_epoch == c1.epoch and h.queue("t", 1).leader_epoch == 1
    c1.close()  # resign: c2 takes over at once, with a larger epoch
    wait_until(lambda: c2.is_leader, 10)
    assert c2.epoch > c1.epoch
    h.register("b2")
    h.kill("b0")  # t/0 and t/1 now both lead on b0; ISR (b0, b1) -> b1 is dead too: offline
    wait_until(lambda: h.queue("t", 0).leader_epoch == 1 and h.queue("t", 1).leader_epoch == 2, 10)
    assert wrote["c2"] == ["t"]
    assert [q.controller_epoch for q in h.metadata.get_topic("t").queues] == [c2.epoch] * 2


def test_controller_killed_mid_failover_is_finished_by_the_next_and_fenced(
    h: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    caplog.set_level(logging.WARNING, logger="gms.nameserver.controller")
    monkeypatch.setattr(metadata_module, "TXN_OPS_MAX", 2)  # the fence and one topic: a transaction per topic
    blocked, release = threading.Event(), threading.Event()

    def pause_on_b(topic: str) -> None:
        if topic == "b":  # after writing topic "a", before writing "b"
            blocked.set()
            release.wait(10)

    h.register("b0", "b1")
    h.metadata.create_topic("a", queue_count=1, replicas=2)
    h.metadata.create_topic("b", queue_count=1, replicas=2)
    c1 = h.controller("c1", pause_on_b)
    wait_until(lambda: c1.is_leader, 10)
    c2 = h.controller("c2")
    c1_epoch = c1.epoch
    try:
        h.kill("b0")
        wait_until(blocked.is_set, 10)
        assert h.queue("a").leader == "b1" and h.queue("b").leader == "b0"
        h.client.revoke_lease(c1.lease_id)  # c1 "dies" holding its decision for topic b
        took_s = wait_until(lambda: h.queue("b").leader == "b1", 10)
        assert took_s < 1.0
    finally:
        release.set()  # c1 wakes up and tries to write its stale decision
    wait_until(lambda: "deposed" in caplog.text, 10)
    a, b = h.queue("a"), h.queue("b")
    assert (a.leader_epoch, a.controller_epoch) == (1, c1_epoch)
    assert (b.leader_epoch, b.controller_epoch) == (1, c2.epoch)  # c1's write never landed
    assert c2.epoch > c1_epoch


def test_deposed_controller_write_is_rejected(h: Harness):
    h.register("b0")
    h.metadata.create_topic("t", queue_count=1)
    election = Election(h.client, "controller", "old", ttl_s=TTL_S, prefix=h.prefix).start()
    wait_until(lambda: election.is_leader, 10)
    fence = election.fence()
    assert fence is not None and fence.create_revision == election.epoch

    def bump(topic):
        q = topic.queues[0]
        return topic.__class__(topic.name, topic.replication_factor, topic.settings,
                               (QueueState(0, q.replicas, q.leader, q.isr, q.leader_epoch + 1),))

    def update(fence: CreateRevisionIs | None) -> list[list[tuple[TopicMetadata, TopicMetadata]]]:
        assert fence is not None
        kv = h.client.get(h.metadata.keys.topic("t"))
        assert kv is not None
        return list(h.metadata.update_topics([(h.metadata.get_topic("t"), kv.mod_revision)], bump, fence=fence))

    [[(_, written)]] = update(fence)
    assert written.queues[0].leader_epoch == 1
    election.close()  # resigned: its key is gone
    successor = Election(h.client, "controller", "new", ttl_s=TTL_S, prefix=h.prefix).start()
    try:
        wait_until(lambda: successor.is_leader, 10)
        with pytest.raises(ControllerFenced):
            update(fence)
        assert h.queue("t").leader_epoch == 1
        h.metadata.delete_topic("t")  # gone meanwhile: dropped, not written again
        assert list(h.metadata.update_topics([(written, 1)], bump, fence=successor.fence())) == [[]]
        with pytest.raises(TopicNotFoundError):
            h.metadata.get_topic("t")
    finally:
        successor.close()


def test_update_isr_compare_and_swap(h: Harness):
    h.register("b0", "b1", "b2")
    h.metadata.create_topic("t", queue_count=6, replicas=3)
    m = h.metadata
    assert m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b2", "b0"])
    assert h.queue("t", 0).isr == ("b0", "b2")  # kept in replica order
    assert m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0", "b2"])  # no-op
    assert not m.update_isr("t", 0, leader_id="b0", leader_epoch=1, isr=["b0"])  # stale epoch
    assert not m.update_isr("t", 0, leader_id="b1", leader_epoch=0, isr=["b1"])  # not the leader
    assert not m.update_isr("gone", 0, leader_id="b0", leader_epoch=0, isr=["b0"])
    assert not m.update_isr("t", 99, leader_id="b0", leader_epoch=0, isr=["b0"])
    with pytest.raises(BadRequestError, match="lacks its leader"):
        m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b1"])
    with pytest.raises(BadRequestError, match="not within replicas"):
        m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0", "b9"])
    assert h.queue("t", 0).isr == ("b0", "b2")
    # computed from an ISR no longer stored (the controller changed it meanwhile): refused
    assert not m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0", "b1", "b2"], based_on=["b0"])
    assert m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0", "b1", "b2"], based_on=["b2", "b0"])
    assert m.update_isr("t", 0, leader_id="b0", leader_epoch=0, isr=["b0", "b2"], based_on=["b0", "b1", "b2"])
    assert h.queue("t", 0).isr == ("b0", "b2")

    # every queue's leader shrinks at once: unrelated concurrent writes are retried over
    results: list[bool] = []
    start = threading.Barrier(6)

    def shrink(queue_id: int) -> None:
        q = h.queue("t", queue_id)
        start.wait()
        results.append(m.update_isr("t", queue_id, leader_id=q.leader, leader_epoch=0,
                                    isr=[q.leader]))

    threads = [threading.Thread(target=shrink, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 6
    assert all(q.isr == (q.leader,) for q in h.metadata.get_topic("t").queues)


def test_nameservers_run_the_controller_and_report_it(h: Harness, etcd: EmbeddedEtcd):
    h.register("b0", "b1")
    running = [RunningNameServer(etcd.endpoint, h.prefix, ttl_s=TTL_S) for _ in range(2)]
    first, second = running
    try:
        wait_until(lambda: second.call(C.CLUSTER_STATUS)["controller"]["id"] == first.address, 10)
        one, two = (ns.call(C.CLUSTER_STATUS)["controller"] for ns in running)
        assert one == {"id": first.address, "epoch": one["epoch"], "this": True}
        assert two == {"id": first.address, "epoch": one["epoch"], "this": False}
        first.call(C.CREATE_TOPIC, {"topic": "t", "queues": 2, "replicas": 2})
        h.kill("b0")

        def leaders() -> list[str]:
            return [q["leader"] for q in second.call(C.GET_ROUTE, {"topic": "t"})["queues"]]

        wait_until(lambda: leaders() == ["10.0.0.2:10911"] * 2, 10)
        running.remove(first)
        first.stop()  # resigns: the second nameserver's controller takes over at once
        wait_until(lambda: second.call(C.CLUSTER_STATUS)["controller"]["this"], 10)
        assert second.call(C.CLUSTER_STATUS)["controller"]["epoch"] > one["epoch"]
    finally:
        for ns in running:
            ns.stop()
