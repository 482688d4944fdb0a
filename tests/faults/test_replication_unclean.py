"""A broker restarting after an unclean stop may have lost records it acknowledged but had not
flushed: it is not electable, nor in any ISR, until it has caught up with its leaders (Kafka's
KIP-966). Restarted within its lease, a killed leader would otherwise keep leading and its
followers would truncate to its shorter log."""

from __future__ import annotations

import re

import pytest
from ha_helpers import HaCluster, request, wait_for

from gms.broker.server import broker_id_for
from gms.cluster.model import BrokerInfo
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch


@pytest.fixture
def cluster(tmp_path):
    cluster = HaCluster(tmp_path).start(nameservers=1, brokers=3)
    yield cluster
    cluster.stop()


def registered(cluster: HaCluster, broker_id: str) -> BrokerInfo | None:
    metadata = cluster.metadata()
    try:
        return next((b for b in metadata.live_brokers() if b.broker_id == broker_id), None)
    finally:
        metadata.client.close()


def test_leader_restarted_uncleanly_within_its_lease_hands_over_and_rejoins_once_caught_up(cluster):
    topic = "unclean"
    cluster.create_topic(topic, 1)
    old = cluster.topic(topic).queues[0]
    leader = cluster.broker_by_id(old.leader)
    batch = encode_batch([Message(topic=topic, body=b"acked", queue_id=0)] * 10)
    request(leader.address, RequestCode.SEND, {"acks": -1}, batch)
    leader.kill()
    leader.restart()  # re-registers before its old lease expires: no BROKER_DOWN in between
    assert broker_id_for(leader.address) == old.leader
    moved = wait_for(lambda: (q := cluster.topic(topic).queues[0]).leader != old.leader and q, 15)
    assert moved.leader_epoch > old.leader_epoch
    # The controller's decision left it out of the ISR (it may be back by now: it catches up fast).
    decision = re.search(rf"{topic}/0 leader {old.leader} -> (\S+), leader epoch 0 -> 1, isr (\[.*\])",
                         cluster.nameservers[0].log_tail(100_000))
    assert decision is not None and old.leader not in decision.group(2), decision
    # It follows the new leader, catches up, says so, and the leader takes it back in.
    wait_for(lambda: old.leader in cluster.topic(topic).queues[0].isr, 20)
    info = registered(cluster, old.leader)
    assert info is not None and info.caught_up
    new_leader = cluster.broker_by_id(moved.leader)
    # The acknowledged records are all there; the new leader's high watermark reaches them once
    # its ISR (the rejoined broker too) has fetched them.
    wait_for(lambda: request(new_leader.address, RequestCode.QUERY_MAX_OFFSET,
                             {"topic": topic, "queue_id": 0})["offset"] == 10, 10)


def test_clean_restart_stays_electable(cluster):
    broker = cluster.brokers[0]
    broker_id = broker_id_for(broker.address)
    broker.stop()
    broker.restart()
    info = wait_for(lambda: registered(cluster, broker_id), 10)
    assert info.caught_up
