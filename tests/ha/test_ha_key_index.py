"""The key index on replicas: followers index the records they copy (the replication append
goes through the store's append path), so after the leader is SIGKILLed the new leader finds
messages by key, and the ids it answers resolve on it; ids the killed leader handed out resolve on its replicas."""

from __future__ import annotations

from ha_helpers import HaCluster, request, wait_for

from gms.client import Admin, Producer, ProducerRecord
from gms.protocol.codes import RequestCode

FAILOVER_TIMEOUT_S = 15


def test_keys_are_found_on_the_new_leader_after_the_leader_is_killed(ha_cluster: HaCluster):
    topic = "keyed"
    ha_cluster.create_topic(topic, 1)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1) as producer:
        for i in range(30):
            producer.send(topic, b"m-%d" % i, keys=(f"order-{i}", "all"), queue=0)
    state = ha_cluster.topic(topic).queues[0]
    followers = [ha_cluster.broker_by_id(b) for b in state.replicas if b != state.leader]
    for follower in followers:  # replicated records are indexed as they are copied
        wait_for(lambda f=follower: request(f.address, RequestCode.FIND_BY_KEY,
                                            {"topic": topic, "key": "order-29"})["count"] == 1)
    ha_cluster.broker_by_id(state.leader).kill()
    wait_for(lambda: ha_cluster.topic(topic).queues[0].leader not in (None, state.leader), FAILOVER_TIMEOUT_S)
    with Admin(nameserver=ha_cluster.nameserver) as admin:
        [found] = wait_for(lambda: admin.find_by_key(topic, "order-17"), FAILOVER_TIMEOUT_S)
        assert (found.body, found.queue_offset) == (b"m-17", 17)
        assert admin.view_message(found.msg_id).body == b"m-17"
        # Answers hold committed records only: the new leader's high watermark may take a
        # replication round to reach the last acknowledged one.
        wait_for(lambda: len(admin.find_by_key(topic, "all", max_messages=100)) == 30, FAILOVER_TIMEOUT_S)


def test_message_ids_of_a_killed_leader_resolve_on_its_replicas(ha_cluster: HaCluster):
    """An id names the broker that stored the message; with that broker SIGKILLed, Admin finds the
    copy a follower made of it (the follower noted where its replicated records lay on the leader)."""
    topic = "ids"
    ha_cluster.create_topic(topic, 2)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1) as producer:
        sent = [producer.send(topic, b"m-%d" % i, queue=i % 2) for i in range(40)]
        sent += producer.send_batch([ProducerRecord(topic, b"b-%d" % i, queue=i % 2) for i in range(40)])
    leader = ha_cluster.topic(topic).queues[0].leader
    ha_cluster.broker_by_id(leader).kill()
    wait_for(lambda: ha_cluster.topic(topic).queues[0].leader not in (None, leader), FAILOVER_TIMEOUT_S)
    with Admin(nameserver=ha_cluster.nameserver) as admin:
        for result in sent:
            message = admin.view_message(result.msg_id)
            assert (message.msg_id, message.queue_id, message.queue_offset) == (
                result.msg_id, result.queue_id, result.queue_offset)
        assert {admin.view_message(r.msg_id).body for r in sent} == (
            {b"m-%d" % i for i in range(40)} | {b"b-%d" % i for i in range(40)})
