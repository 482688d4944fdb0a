"""Retention on replicated queues: the leader expires only what its ISR has (the HW); a follower
that was down while the leader expired the records it misses starts its queue over at the
leader's first offset, catches up and rejoins the ISR."""

from __future__ import annotations

from ha_helpers import BROKER_TOML, HaCluster, request, wait_for

from gms.broker.server import broker_id_for
from gms.client import Producer
from gms.protocol.codes import RequestCode

RETENTION_MS = 1500


def offsets(address: str, topic: str) -> tuple[int, int]:
    fields = {"topic": topic, "queue_id": 0}
    low = request(address, RequestCode.QUERY_MIN_OFFSET, fields)["offset"]
    return low, request(address, RequestCode.TOPIC_STATS, {"topic": topic})["queues"][0]["max_offset"]


def test_follower_behind_the_leaders_retention_starts_over_and_rejoins(tmp_path):
    config = tmp_path / "retention.toml"
    config.write_text(BROKER_TOML + "\n[store]\nretention_check_interval_ms = 200\ncheckpoint_interval_ms = 50\n")
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config))).start(nameservers=1, brokers=2)
    try:
        cluster.create_topic("r", 1, replicas=2, min_isr=1)
        request(cluster.nameservers[0].address, RequestCode.UPDATE_TOPIC,
                {"topic": "r", "settings": {"retention_ms": RETENTION_MS}})
        queue = cluster.topic("r").queues[0]
        leader = cluster.broker_by_id(queue.leader)
        follower = next(b for b in cluster.brokers if b is not leader)
        with Producer(nameserver=cluster.nameserver) as producer:
            producer.send_batch([{"topic": "r", "body": b"early", "queue": 0}] * 10)
            wait_for(lambda: offsets(follower.address, "r")[1] == 10, 10)
            follower.kill()
            wait_for(lambda: cluster.topic("r").queues[0].isr == (queue.leader,), 20)  # HW moves alone
            producer.send_batch([{"topic": "r", "body": b"missed", "queue": 0}] * 50)
            wait_for(lambda: offsets(leader.address, "r") == (60, 60), 20)  # all expired on the leader
            follower.restart()
            producer.send_batch([{"topic": "r", "body": b"after", "queue": 0}] * 5)
        wait_for(lambda: cluster.topic("r").queues[0].isr == tuple(sorted(
            (queue.leader, broker_id_for(follower.address)), key=queue.replicas.index)), 30)
        wait_for(lambda: offsets(follower.address, "r")[1] == 65, 10)
        assert offsets(follower.address, "r")[0] >= 60  # it never had 10..59, nor serves 0..9
    finally:
        cluster.stop()
