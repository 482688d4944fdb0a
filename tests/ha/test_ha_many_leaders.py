"""Many leadership changes at once: the failover of every queue a broker led moves them all to
the other replica in one burst of assignments, which the survivor applies in a few steps (each
costing the queues that changed); every queue ends with the right role on both brokers, and the
new leaders take sends once their epochs are on disk."""

from __future__ import annotations

from ha_helpers import HaCluster, request, wait_for

from gms.client import Admin, Producer, TopicSpec
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.cluster.model import TopicMetadata
from gms.errors import NotLeaderError
from gms.protocol.codes import RequestCode

TOPICS = 60
QUEUES = 4
TIMEOUT_S = 60


def topics(cluster: HaCluster) -> list[TopicMetadata]:
    client = EtcdClient(cluster.etcd.endpoint)
    try:
        return [t for t in ClusterMetadata(client).list_topics() if t.name.startswith("lead-")]
    finally:
        client.close()


def leads(address: str, topic: str, queue_id: int) -> bool:
    """Whether the broker serves the queue as its leader (a follower refuses: NotLeaderError)."""
    try:
        request(address, RequestCode.QUERY_MAX_OFFSET, {"topic": topic, "queue_id": queue_id})
    except NotLeaderError:
        return False
    return True


def test_failover_of_every_queue_leaves_each_with_the_right_role(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=1, brokers=2)
    try:
        names = [f"lead-{i:03d}" for i in range(TOPICS)]
        with Admin(nameserver=cluster.nameserver) as admin:
            results = admin.create_topics([TopicSpec(name, QUEUES, {"min_insync_replicas": 1}, replicas=2)
                                           for name in names])
        assert all(r.created for r in results)
        wait_for(lambda: len(ts := topics(cluster)) == TOPICS and all(len(q.isr) == 2 for t in ts for q in t.queues),
                 TIMEOUT_S)
        victim = max(cluster.brokers, key=lambda b: sum(
            cluster.broker_by_id(q.leader) is b for t in topics(cluster) for q in t.queues))
        survivor = next(b for b in cluster.brokers if b is not victim)
        victim.kill()
        # Every queue's leadership moves to the survivor; it leads each of them.
        wait_for(lambda: all(cluster.broker_by_id(q.leader) is survivor for t in topics(cluster) for q in t.queues),
                 TIMEOUT_S)
        wait_for(lambda: all(leads(survivor.address, n, q) for n in names for q in range(QUEUES)), TIMEOUT_S)
        with Producer(nameserver=cluster.nameserver) as producer:
            for name in names:
                for queue_id in range(QUEUES):
                    assert producer.send(name, b"after", queue=queue_id).queue_id == queue_id

        victim.restart()  # back as the follower of every queue
        cluster.wait_registered(2)
        wait_for(lambda: all(len(q.isr) == 2 for t in topics(cluster) for q in t.queues), TIMEOUT_S)
        assert not any(leads(victim.address, n, q) for n in names for q in range(QUEUES))
        assert all(leads(survivor.address, n, q) for n in names for q in range(QUEUES))
    finally:
        cluster.stop()
