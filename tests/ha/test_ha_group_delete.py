"""`Admin.delete_group` on a replicated queue: the group's offsets go from the leader and the live
followers at once, a follower that was down during the delete drops its copy when it fetches
again, and after the leader's failover the group stays gone."""

from __future__ import annotations

import pytest
from ha_helpers import wait_for
from test_ha_failover import wait_full_isr, wait_new_leader
from test_ha_group_offsets import committed_on

from gms.client import Admin, Producer
from gms.client.offset_reset import ResetSpec

MESSAGES = 20
RESET_TO = 12
NO_COMMIT = -1


@pytest.mark.slow
def test_deleted_group_stays_deleted_on_followers_and_after_failover(ha_cluster):
    topic, group = "ha-delete", "g-delete"
    ha_cluster.create_topic(topic, 1)
    with Producer(nameserver=ha_cluster.nameserver, acks=-1, linger_ms=0) as producer:
        for i in range(MESSAGES):
            producer.send(topic, f"m{i}".encode(), queue=0)
    with Admin(nameserver=ha_cluster.nameserver) as admin:
        admin.reset_offsets(group, [topic], ResetSpec.to_offset(RESET_TO), execute=True)
    queue = ha_cluster.topic(topic).queues[0]
    leader = ha_cluster.broker_by_id(queue.leader)
    missed, live = (ha_cluster.broker_by_id(b) for b in queue.replicas if b != queue.leader)
    wait_for(lambda: all(committed_on(f.address, group, topic) == RESET_TO for f in (missed, live)), 5)

    missed.stop()  # a clean stop: its copy of the offset is on disk
    with Admin(nameserver=ha_cluster.nameserver) as admin:
        deleted = admin.delete_group(group)
        assert group not in admin.groups()
    assert deleted[leader.address] == [(topic, 0)] and deleted[live.address] == [(topic, 0)]
    assert committed_on(leader.address, group, topic) == committed_on(live.address, group, topic) == NO_COMMIT

    missed.restart()
    assert committed_on(missed.address, group, topic) in (RESET_TO, NO_COMMIT)  # loaded, then fetched
    wait_for(lambda: committed_on(missed.address, group, topic) == NO_COMMIT, 20)
    wait_full_isr(ha_cluster, topic)

    leader.kill()
    new_leader = ha_cluster.broker_by_id(wait_new_leader(ha_cluster, topic, 0, queue.leader))
    assert committed_on(new_leader.address, group, topic) == NO_COMMIT
    with Admin(nameserver=ha_cluster.nameserver) as admin:
        assert group not in admin.groups()
        assert admin.reset_offsets(group, [topic], ResetSpec.earliest())[0].committed is None
