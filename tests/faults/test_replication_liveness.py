"""Replication stays live when a broker pauses or dies: its lease expires, the controller takes it
out of every ISR (and moves the queues it led), so acks=-1 sends work again within the lease TTL
plus a second -- not after the leader's lag window, which is set far longer here to tell the two
apart. The paused leader, once resumed, acknowledges nothing."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from ha_helpers import BROKER_TOML, LEASE_TTL_S, HaCluster, request, wait_for

from gms.broker.server import broker_id_for
from gms.client import Producer
from gms.errors import GmsError
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch

LAG_MAX_MS = 10_000  # the default: a follower's lag alone would keep it in the ISR this long
UNAVAILABLE_MAX_S = LEASE_TTL_S + 1.0
PAUSE_S = LEASE_TTL_S + 4.0


@pytest.fixture
def cluster(tmp_path):
    config = tmp_path / "lag.toml"
    config.write_text(BROKER_TOML.replace("replica_lag_time_max_ms = 1500", f"replica_lag_time_max_ms = {LAG_MAX_MS}"))
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config))).start(nameservers=1, brokers=3)
    yield cluster
    cluster.stop()


class AckTimes(threading.Thread):
    """Sends acks=-1 messages to one queue through the SDK until stopped; records when each was
    acknowledged (the SDK times out on a silent broker and follows the route to the new leader)."""

    def __init__(self, cluster: HaCluster, topic: str, queue_id: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic, self.queue_id = cluster, topic, queue_id
        self.acked_at: list[float] = []
        self.acked: dict[int, bytes] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        with Producer(nameserver=self.cluster.nameserver, acks=-1, retries=1000, retry_backoff_ms=10,
                      linger_ms=0, request_timeout_ms=300) as producer:
            i = 0
            while not self.stopping.is_set():
                body = f"{self.queue_id}-{i}".encode()
                i += 1
                try:
                    result = producer.send(self.topic, body, queue=self.queue_id)
                except GmsError:
                    continue
                self.acked_at.append(time.monotonic())
                assert self.acked.setdefault(result.queue_offset, body) == body

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement between ``start`` and ``end``."""
        times = [start, *(t for t in self.acked_at if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def isr_holders(cluster: HaCluster, topic: str) -> set[str]:
    return {b for q in cluster.topic(topic).queues for b in q.isr}


@pytest.mark.slow
def test_paused_leader_queues_take_acks_all_sends_within_lease_ttl(cluster):
    topic = "live"
    cluster.create_topic(topic, 3)
    paused_id = cluster.topic(topic).queues[0].leader
    paused = cluster.broker_by_id(paused_id)
    producers = [AckTimes(cluster, topic, q) for q in range(3)]
    for p in producers:
        p.start()
    try:
        wait_for(lambda: all(len(p.acked_at) > 20 for p in producers), 20)
        paused.pause()
        paused_at = time.monotonic()
        try:
            time.sleep(PAUSE_S)
            resumed_at = time.monotonic()
            # Measured before the resume: the old leader must not be needed to get back.
            gaps = {p.queue_id: p.longest_gap(paused_at, resumed_at) for p in producers}
            state = cluster.topic(topic)
        finally:
            paused.resume()
        # The resumed old leader is fenced: it acknowledges no acks=-1 write of its old queue.
        body = encode_batch([Message(topic=topic, body=b"fenced?", queue_id=0)])
        with pytest.raises(GmsError):
            request(paused.address, RequestCode.SEND, {"acks": -1}, body, timeout_ms=5000)
    finally:
        for p in producers:
            p.stop()
    print(f"longest acks=-1 gap per queue after pausing {paused_id} (lease {LEASE_TTL_S} s):",
          {q: round(g, 2) for q, g in gaps.items()})
    assert state.queues[0].leader != paused_id
    assert all(paused_id not in q.isr for q in state.queues), state
    assert max(gaps.values()) <= UNAVAILABLE_MAX_S, gaps


@pytest.mark.slow
def test_dead_follower_leaves_every_isr_within_lease_ttl(cluster):
    topic = "isr"
    cluster.create_topic(topic, 3)
    victim = cluster.brokers[0]
    victim_id = broker_id_for(victim.address)
    assert victim_id in isr_holders(cluster, topic)
    victim.kill()
    killed_at = time.monotonic()
    wait_for(lambda: victim_id not in isr_holders(cluster, topic), 2 * LEASE_TTL_S + LAG_MAX_MS / 1000, 0.02)
    elapsed = time.monotonic() - killed_at
    print(f"killed follower out of every ISR after {elapsed:.2f} s (lease {LEASE_TTL_S} s)")
    assert elapsed <= UNAVAILABLE_MAX_S
    # The remaining ISR takes acks=-1 sends at once on every queue (min_insync_replicas 2).
    for q in cluster.topic(topic).queues:
        body = encode_batch([Message(topic=topic, body=b"after", queue_id=q.queue_id)])
        request(cluster.broker_by_id(q.leader).address, RequestCode.SEND, {"acks": -1}, body, timeout_ms=2000)
