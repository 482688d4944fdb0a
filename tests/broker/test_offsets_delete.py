"""Deleting a group's committed offsets, and how the delete reaches followers: as DELETED rows of
the leader's commit stream, or by absence from a complete (new session) answer."""

from __future__ import annotations

from gms.broker.offsets import DELETED, OffsetStore
from gms.protocol.replication import GroupCommit


def test_delete_group_forgets_its_offsets_and_survives_reload(tmp_path):
    path = tmp_path / "offsets.json"
    store = OffsetStore(path)
    store.commit("g", "t", 0, 5)
    store.commit("g", "u", 1, 7)
    store.commit("other", "t", 0, 3)
    assert sorted(store.delete_group("g")) == [("t", 0), ("u", 1)]
    assert store.groups() == ["other"]
    assert store.get("g", "t", 0) is None and store.delete_group("g") == []
    store.persist()
    assert OffsetStore(path).groups() == ["other"]


def test_deletes_travel_as_deleted_rows_after_the_followers_seq(tmp_path):
    leader = OffsetStore(tmp_path / "leader.json")
    leader.commit("g", "t", 0, 5)
    leader.commit("other", "t", 0, 3)
    seen = leader.seq
    leader.delete_group("g")
    assert leader.changed_since("t", 0, seen) == [GroupCommit("g", DELETED)]
    assert sorted(leader.changed_since("t", 0, 0)) == [GroupCommit("g", DELETED), GroupCommit("other", 3)]

    follower = OffsetStore(tmp_path / "follower.json")
    follower.commit("g", "t", 0, 5)
    follower.commit("other", "t", 0, 3)
    follower.apply_replicated("t", 0, leader.changed_since("t", 0, seen), complete=False)
    assert follower.groups() == ["other"]
    # A follower's own followers learn the delete from it in turn.
    assert GroupCommit("g", DELETED) in follower.changed_since("t", 0, 0)


def test_a_complete_answer_drops_groups_the_leader_no_longer_has(tmp_path):
    """The follower missed the delete and the leader restarted since (no DELETED row left):
    the first answer of the leader's new session names every group it has on the queue."""
    path = tmp_path / "leader.json"
    leader = OffsetStore(path)
    leader.commit("kept", "t", 0, 4)
    leader.persist()
    restarted = OffsetStore(path)

    follower = OffsetStore(tmp_path / "follower.json")
    follower.commit("deleted", "t", 0, 9)
    follower.commit("deleted", "t", 1, 2)  # another queue: not this answer's business
    follower.commit("kept", "t", 0, 1)
    follower.apply_replicated("t", 0, restarted.changed_since("t", 0, 0), complete=True)
    assert (follower.get("kept", "t", 0), follower.get("deleted", "t", 0)) == (4, None)
    assert follower.get("deleted", "t", 1) == 2
    follower.apply_replicated("t", 1, [], complete=False)  # incremental and empty: nothing changes
    assert follower.get("deleted", "t", 1) == 2


def test_delete_topic_leaves_no_empty_group(tmp_path):
    store = OffsetStore(tmp_path / "offsets.json")
    store.commit("g", "t", 0, 1)
    store.delete_topic("t")
    assert store.groups() == []
