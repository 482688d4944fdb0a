"""A leader restarted after an unclean stop (SIGKILL, back before its lease lapses) while its
followers are in the ISR hands the queue over to one of them (KIP-966: it may have lost records
it acknowledged but had not flushed). Consumers never lose sight of acknowledged (below-HW)
messages nor see its unreplicated (above-HW) tail: straight after the restart it serves at most
its checkpointed high watermark, the new leader has every acknowledged message, and the old
leader drops the tail and rejoins."""

from __future__ import annotations

import time

from ha_helpers import HaCluster, request, wait_for
from test_ha_failover import leader_of, pull_all

from gms.client import Producer
from gms.errors import NotLeaderError
from gms.protocol.codes import RequestCode

# A lease long enough for the killed leader to come back before its lease lapses, a lag window
# long enough for the paused followers to stay in the ISR meanwhile.
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


def served_hw(address: str, topic: str) -> int | None:
    """The HW a broker serves for queue 0; None once it no longer leads it."""
    try:
        return hw_of(address, topic)
    except NotLeaderError:
        return None


def test_leader_restarted_uncleanly_hands_over_without_serving_its_tail(tmp_path):
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
            # Straight after the restart: the checkpointed HW (not 0, not the log end) while it
            # still leads; the controller soon moves the queue to a caught-up follower.
            assert served_hw(leader.address, topic) in (REPLICATED, None)
            moved = wait_for(lambda: (q := cluster.topic(topic).queues[0]).leader != queue.leader and q, 20)
            assert queue.leader not in moved.isr
        finally:
            for f in followers:
                f.resume()
        new_leader = cluster.broker_by_id(moved.leader)
        wait_for(lambda: len(cluster.topic(topic).queues[0].isr) == 3, 30)  # the old leader is back
        # Every acknowledged message; of the acks=1 tail at most what a follower copied from the
        # restarted leader in the moment before it learnt the new epoch.
        def consistent() -> bool:
            read = pull_all(new_leader.address, topic, 0)
            return len(read) >= REPLICATED and read == [(i, f"m{i}".encode()) for i in range(len(read))]

        wait_for(consistent, 20)  # once the new leader's HW is back
        assert served_hw(leader.address, topic) is None
    finally:
        cluster.stop()
