"""The controller's failover rules and the replication settings, as pure functions (no etcd)."""

import json

import pytest

from gms.cluster.model import QueueState, TopicMetadata, TopicSettings, new_topic
from gms.errors import InvalidTopicError
from gms.nameserver.failover import next_queue_state, reassign_leaders

Q = QueueState(0, ("a", "b", "c"), "a", ("a", "b", "c"), leader_epoch=4, controller_epoch=7)


def step(q: QueueState, live: set[str], unclean: bool = False) -> QueueState:
    return next_queue_state(q, live, unclean=unclean, controller_epoch=9)


def test_live_leader_keeps_leading_and_dead_followers_leave_the_isr():
    assert step(Q, {"a", "b", "c"}) is Q
    new = step(Q, {"a", "c"})  # b's lease expired (dead or paused): acks=-1 must not wait for it
    assert (new.leader, new.isr, new.leader_epoch, new.controller_epoch) == ("a", ("a", "c"), 4, 9)
    assert step(new, {"a", "b", "c"}) is new  # back: the leader takes it in once it caught up


def test_first_live_isr_member_in_replica_order_leads_and_dead_ones_leave_the_isr():
    q = QueueState(0, ("a", "b", "c"), "a", ("a", "c", "b"), leader_epoch=4)
    new = step(q, {"b", "c"})
    assert (new.leader, new.isr, new.leader_epoch, new.controller_epoch) == ("b", ("b", "c"), 5, 9)
    new = step(q, {"c"})
    assert (new.leader, new.isr, new.leader_epoch) == ("c", ("c",), 5)


def test_no_live_isr_member_goes_offline_keeping_the_isr_then_the_first_back_leads():
    q = QueueState(0, ("a", "b", "c"), "a", ("a",), leader_epoch=4)
    offline = step(q, {"b", "c"})
    assert (offline.leader, offline.isr, offline.leader_epoch) == (None, ("a",), 5)
    assert step(offline, {"b", "c"}) is offline  # out-of-sync replicas never lead (clean)
    back = step(offline, {"a", "b"})
    assert (back.leader, back.isr, back.leader_epoch) == ("a", ("a",), 6)


def test_a_broker_catching_up_after_an_unclean_restart_leaves_the_isr_and_leads_only_as_last_resort():
    def catching(q: QueueState, live: set[str], behind: set[str]) -> QueueState:
        return next_queue_state(q, live, unclean=False, controller_epoch=9, catching_up=behind)

    everyone = {"a", "b", "c"}
    new = catching(Q, everyone, {"b"})  # a follower restarted uncleanly: out of the ISR
    assert (new.leader, new.isr, new.leader_epoch) == ("a", ("a", "c"), 4)
    new = catching(Q, everyone, {"a"})  # the leader restarted uncleanly within its lease: moves
    assert (new.leader, new.isr, new.leader_epoch) == ("b", ("b", "c"), 5)
    alone = QueueState(0, ("a", "b", "c"), "a", ("a",), leader_epoch=4)
    assert catching(alone, everyone, {"a"}) is alone  # nobody has more than it: it keeps leading
    led_by_c = QueueState(0, ("a", "b", "c"), "c", ("a", "b", "c"), leader_epoch=4)
    new = catching(led_by_c, {"a", "b"}, {"a", "b"})  # c died; everyone left is catching up
    assert (new.leader, new.isr, new.leader_epoch) == ("a", ("a",), 5)
    assert catching(new, everyone, set()) is new  # caught up: the leader takes them back


def test_unclean_election_picks_the_first_live_replica():
    q = QueueState(0, ("a", "b", "c"), "a", ("a",), leader_epoch=4)
    new = step(q, {"c", "b"}, unclean=True)
    assert (new.leader, new.isr, new.leader_epoch) == ("b", ("b",), 5)
    assert step(q, {"a"}, unclean=True) is q
    assert step(q, set(), unclean=True).leader is None


def test_reassign_returns_the_same_topic_when_nothing_changes():
    topic = new_topic("t", 3, 2, TopicSettings(), ["a", "b", "c"])
    assert reassign_leaders(topic, {"a", "b", "c"}, controller_epoch=1) is topic
    moved = reassign_leaders(topic, {"a", "c"}, controller_epoch=1)
    assert [q.leader for q in moved.queues] == ["a", "c", "c"]
    assert [q.leader_epoch for q in moved.queues] == [0, 1, 0]


@pytest.mark.parametrize(("replicas", "expected"), [(1, 1), (2, 2), (3, 2)])
def test_min_isr_defaults_from_the_replication_factor(replicas: int, expected: int):
    topic = new_topic("t", 1, replicas, TopicSettings(), ["a", "b", "c"])
    assert topic.settings.min_insync_replicas == expected
    assert not topic.settings.unclean_leader_election


def test_replication_settings_are_validated():
    with pytest.raises(InvalidTopicError, match=r"min_insync_replicas must be 1\.\.2"):
        new_topic("t", 1, 2, TopicSettings(min_insync_replicas=3), ["a", "b"])
    with pytest.raises(InvalidTopicError):
        TopicSettings(min_insync_replicas=0)
    with pytest.raises(InvalidTopicError, match="true or false"):
        TopicSettings.from_dict({"unclean_leader_election": 1})
    settings = TopicSettings.from_dict({"min_insync_replicas": 1, "unclean_leader_election": True})
    assert new_topic("t", 1, 3, settings, ["a", "b", "c"]).settings == settings


def test_json_round_trip_and_values_written_before_replication_still_read():
    topic = new_topic("t", 2, 2, TopicSettings(unclean_leader_election=True), ["a", "b"])
    assert TopicMetadata.from_json(topic.to_json()) == topic
    old = {
        "v": 1, "name": "t", "replication_factor": 3,
        "settings": {"retention_ms": 1000, "message_size_bytes_max": 1024},
        "queues": [{"id": 0, "replicas": ["a", "b", "c"], "leader": "a", "isr": ["a"],
                    "leader_epoch": 3}],
    }
    decoded = TopicMetadata.from_json(json.dumps(old).encode())
    assert decoded.settings == TopicSettings(1000, 1024, 2, False)
    assert decoded.queues[0] == QueueState(0, ("a", "b", "c"), "a", ("a",), 3, 0)
