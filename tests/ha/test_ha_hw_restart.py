"""A leader restarted (SIGKILL, back before its lease lapses, so it stays leader) starts from its
checkpointed high watermark: consumers neither lose sight of acknowledged (below-HW) messages
nor see its unreplicated (above-HW) tail until the followers have it."""

from __future__ import annotations

import time

from ha_helpers import HaCluster, request, wait_for
from test_ha_failover import leader_of, pull_all

from gms.client import Producer
from gms.protocol.codes import RequestCode

# A lease long enough for the killed leader to come back before the controller moves the queue,
# a lag window long enough for the paused followers to stay in the ISR meanwhile.
BROKER_TOML = """
[broker]
lease_ttl_s = 10
replica_lag_time_max_ms = 6000
replica_fetch_wait_ms = 200
hw_checkpoint_interval_ms = 100
send_timeout_ms = 4000
"""
REPLICATED = 50
UNREPLICATED = 20


class SlowFailoverCluster(HaCluster):
    def add_broker(self, *args: str):
        config = self.root / f"broker{len(self.brokers)}.toml"
        config.write_text(BROKER_TOML)
        return super(HaCluster, self).add_broker("--config", str(config), *args)


def hw_of(address: str, topic: str) -> int:
    return request(address, RequestCode.QUERY_MAX_OFFSET, {"topic": topic, "queue_id": 0})["offset"]


def test_restarted_leader_keeps_its_high_watermark(tmp_path):
    cluster = SlowFailoverCluster(tmp_path).start(nameservers=1, brokers=3)
    try:
        topic = "ha-hw"
        cluster.create_topic(topic, 1)
        queue = cluster.topic(topic).queues[0]
        leader = leader_of(cluster, topic, 0)
        followers = [cluster.broker_by_id(b) for b in queue.replicas if b != queue.leader]
        with Producer(nameserver=cluster.nameserver, acks=-1, linger_ms=0) as producer:
            for i in range(REPLICATED):
                producer.send(topic, f"m{i}".encode(), queue=0)
        assert hw_of(leader.address, topic) == REPLICATED
        time.sleep(0.5)  # several HW checkpoints

        for f in followers:
            f.pause()
        try:
            with Producer(nameserver=cluster.nameserver, acks=1, linger_ms=0) as producer:
                for i in range(REPLICATED, REPLICATED + UNREPLICATED):
                    producer.send(topic, f"m{i}".encode(), queue=0)
            assert hw_of(leader.address, topic) == REPLICATED  # the tail is above the HW
            leader.kill()
            leader.restart()
            assert cluster.topic(topic).queues[0].leader == queue.leader  # still the leader
            # Straight after the restart: the checkpointed HW, not 0 and not the log end.
            assert wait_for(lambda: [hw_of(leader.address, topic)], 5) == [REPLICATED]
            assert [o for o, _ in pull_all(leader.address, topic, 0)] == list(range(REPLICATED))
        finally:
            for f in followers:
                f.resume()
        # The followers fetch the tail: the HW covers it, consumers see it.
        wait_for(lambda: hw_of(leader.address, topic) == REPLICATED + UNREPLICATED, 10)
        read = pull_all(leader.address, topic, 0)
        assert read == [(i, f"m{i}".encode()) for i in range(REPLICATED + UNREPLICATED)]
    finally:
        cluster.stop()
