"""Group coordination rules, driven with explicit time."""

import pytest

from gms.broker.groups import GroupCoordinator, allocate_evenly
from gms.broker.offsets import OffsetStore

TOPIC = "orders"
EXPIRY_MS = 1_000


def coordinator(queues=8):
    return GroupCoordinator(lambda t: list(range(queues)) if t == TOPIC else [], EXPIRY_MS)


def beat(coord, member, held=(), now=0, mode="clustering"):
    held_keys = [(TOPIC, q) for q in held]
    return coord.heartbeat(
        "g", member, client_address="127.0.0.1:1", mode=mode,
        subscription={TOPIC: "*"}, held=held_keys, now_ms=now,
    )[TOPIC]


def test_allocate_evenly_spreads_remainder_first():
    assert allocate_evenly(list(range(8)), ["c", "a", "b"]) == {
        "a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert allocate_evenly([0, 1], ["a", "b", "c"])["c"] == []


def test_single_member_gets_every_queue():
    assert beat(coordinator(), "a") == list(range(8))


def test_queue_moves_only_after_previous_owner_releases():
    coord = coordinator()
    held_a = beat(coord, "a", now=0)
    assert beat(coord, "b", now=10) == []  # everything still held by a
    # a learns its new share; until it reports the release, b gets nothing.
    held_a = beat(coord, "a", held=held_a, now=20)
    assert held_a == [0, 1, 2, 3]
    assert coord.owner("g", TOPIC, 5) == "a"  # not yet released: a still reported it held
    assert beat(coord, "b", now=30) == []
    beat(coord, "a", held=held_a, now=40)  # release reported
    assert beat(coord, "b", now=50) == [4, 5, 6, 7]
    owners = {coord.owner("g", TOPIC, q) for q in range(8)}
    assert owners == {"a", "b"}


def test_no_queue_ever_has_two_consumers():
    coord = coordinator()
    held = {m: [] for m in "abc"}
    for step in range(30):
        member = "abc"[step % 3]
        held[member] = beat(coord, member, held=held[member], now=step)
        claimed = [q for qs in held.values() for q in qs]
        assert len(claimed) == len(set(claimed))
    assert sorted(q for qs in held.values() for q in qs) == list(range(8))


def test_expired_member_loses_its_queues():
    coord = coordinator()
    beat(coord, "a", now=0)
    assert beat(coord, "b", now=EXPIRY_MS + 1) == list(range(8))
    assert not coord.may_consume("g", "a", TOPIC, 0)
    assert coord.may_consume("g", "b", TOPIC, 0)


def test_leave_releases_immediately():
    coord = coordinator()
    held_a = beat(coord, "a", now=0)
    beat(coord, "b", now=1)
    coord.leave("g", "a")
    assert held_a and beat(coord, "b", now=2) == list(range(8))


def test_broadcasting_members_all_read_everything():
    coord = coordinator()
    assert beat(coord, "a", mode="broadcasting") == list(range(8))
    assert beat(coord, "b", mode="broadcasting") == list(range(8))
    assert coord.may_consume("g", "a", TOPIC, 3) and coord.may_consume("g", "b", TOPIC, 3)


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="consumer mode"):
        beat(coordinator(), "a", mode="fanout")


def test_offsets_survive_reload(tmp_path):
    path = tmp_path / "config" / "consumer_offsets.json"
    store = OffsetStore(path)
    store.commit("g", TOPIC, 3, 42)
    store.persist()
    reloaded = OffsetStore(path)
    assert reloaded.get("g", TOPIC, 3) == 42 and reloaded.get("g", TOPIC, 4) is None
    assert reloaded.group_offsets("g") == {TOPIC: {3: 42}}


def test_a_group_without_members_is_forgotten():
    coord = coordinator()
    beat(coord, "a", now=0)
    beat(coord, "b", now=0)
    coord.leave("g", "a")
    assert coord.group_names() == ["g"]
    coord.leave("g", "b")
    assert coord.group_names() == [] and coord.group("g") is None
    beat(coord, "c", now=0)
    coord.expire(EXPIRY_MS + 1)
    assert coord.group_names() == []
