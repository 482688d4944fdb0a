"""The key index on replicas: followers index the records they copy (the replication append
goes through the store's append path), so after the leader is SIGKILLed the new leader finds
messages by key, and the ids it answers resolve on it."""

from __future__ import annotations

from ha_helpers import HaCluster, request, wait_for

from gms.client import Admin, Producer
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
        assert len(admin.find_by_key(topic, "all", max_messages=100)) == 30
