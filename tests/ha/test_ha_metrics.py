"""Replication metrics on real replicated brokers: ISR size, follower lag, under-replicated
queues and the high watermark's advance latency, before and after a follower dies."""

from __future__ import annotations

import pytest
from ha_helpers import LAG_MAX_MS, HaCluster, request, wait_for
from processes import free_port
from scrape import scrape

from gms.broker.server import broker_id_for
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch

pytestmark = pytest.mark.timeout(90)


def test_isr_follower_lag_and_hw_latency(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=1, brokers=0)
    try:
        ports = {}
        for _ in range(3):
            port = free_port()
            broker = cluster.add_broker("--metrics-listen", f"127.0.0.1:{port}")
            ports[broker_id_for(broker.address)] = port
        cluster.wait_registered(3)
        cluster.create_topic("ha-watched", 1)
        leader_id = cluster.topic("ha-watched").queues[0].leader
        leader = cluster.broker_by_id(leader_id)
        batch = encode_batch([Message(topic="ha-watched", body=b"r" * 50, queue_id=0)] * 20)
        for _ in range(5):
            request(leader.address, RequestCode.SEND, {"acks": -1}, batch)
        queue = (("queue", "0"), ("topic", "ha-watched"))
        metrics = scrape(ports[leader_id])
        assert metrics["gms_broker_queue_isr_size", queue] == 3
        assert metrics["gms_broker_under_replicated_queues", ()] == 0
        assert metrics["gms_broker_send_ack_seconds_count", (("acks", "-1"),)] == 5
        assert metrics["gms_broker_hw_advance_seconds_count", ()] >= 5
        followers = [b for b in ports if b != leader_id]
        assert all(metrics["gms_broker_follower_lag_messages", (("follower", f), *queue)] == 0 for f in followers)
        assert all(metrics["gms_broker_follower_lag_seconds", (("follower", f), *queue)] < LAG_MAX_MS / 1000
                   for f in followers)
        cluster.broker_by_id(followers[0]).kill()
        request(leader.address, RequestCode.SEND, {"acks": 1}, batch)

        def shrunk() -> dict:
            metrics = scrape(ports[leader_id])
            return metrics if metrics["gms_broker_under_replicated_queues", ()] == 1 else {}
        metrics = wait_for(shrunk, LAG_MAX_MS / 1000 + 10)
        assert metrics["gms_broker_queue_isr_size", queue] == 2
        # Out of the ISR, the dead follower's progress is forgotten until it fetches again.
        assert ("gms_broker_follower_lag_messages", (("follower", followers[0]), *queue)) not in metrics
        assert metrics["gms_broker_follower_lag_messages", (("follower", followers[1]), *queue)] == 0
    finally:
        cluster.stop()
