"""Group coordination rules, driven with explicit time."""

import pytest

from gms.broker.groups import (
    REBALANCE_HEARTBEAT_INTERVAL_MS,
    GroupCoordinator,
    allocate_evenly,
    coordinator_index,
)
from gms.broker.offsets import OffsetStore
from gms.broker.queue_claims import QueueClaims
from gms.errors import QueueHeldError

TOPIC = "orders"
EXPIRY_MS = 1_000


def coordinator(queues=8):
    return GroupCoordinator(lambda t: queues if t == TOPIC else 0, EXPIRY_MS)


def beat(coord, member, held=(), now=0, mode="clustering"):
    held_keys = [(TOPIC, q) for q in held]
    return coord.heartbeat(
        "g", member, client_address="127.0.0.1:1", mode=mode,
        subscription={TOPIC: "*"}, held=held_keys, now_ms=now,
    ).assignment[TOPIC]


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
    assert {coord.owner("g", TOPIC, q) for q in range(8)} == {"b"}


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
    assert coord.owner("g", TOPIC, 3) is None


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


def test_a_new_coordinator_adopts_what_members_report_held():
    """After a coordinator restart or failover the first member to report a queue held keeps
    it; a later reporter is told it is not its own, so it releases it (the queue leaders' claims
    keep the two from reading it at once meanwhile)."""
    coord = coordinator()
    assert beat(coord, "a", held=[0, 1, 2, 3], now=0) == list(range(8))  # adopted, the rest added
    assert beat(coord, "b", held=[0, 1, 4], now=1) == []  # a owns them all
    assert {coord.owner("g", TOPIC, q) for q in range(8)} == {"a"}
    assert beat(coord, "a", held=range(8), now=2) == [0, 1, 2, 3]  # then the usual hand-off
    beat(coord, "a", held=range(4), now=3)
    assert beat(coord, "b", now=4) == [4, 5, 6, 7]


def test_rebalancing_groups_are_told_to_heartbeat_sooner():
    coord = coordinator()
    settled = coord.heartbeat("g", "a", client_address="", mode="clustering", subscription={TOPIC: "*"},
                              held=[], now_ms=0)
    assert settled.heartbeat_interval_ms == coord.heartbeat_interval_ms > REBALANCE_HEARTBEAT_INTERVAL_MS
    joined = coord.heartbeat("g", "b", client_address="", mode="clustering", subscription={TOPIC: "*"},
                             held=[], now_ms=1)
    assert joined.assignment == {TOPIC: []}  # a still holds everything
    assert joined.heartbeat_interval_ms == REBALANCE_HEARTBEAT_INTERVAL_MS
    beat(coord, "a", held=range(8), now=2)
    beat(coord, "a", held=range(4), now=3)
    done = coord.heartbeat("g", "b", client_address="", mode="clustering", subscription={TOPIC: "*"},
                           held=[], now_ms=4)
    assert done.assignment == {TOPIC: [4, 5, 6, 7]} and done.heartbeat_interval_ms == coord.heartbeat_interval_ms


def test_each_topic_is_spread_over_its_own_subscribers():
    counts = {"two": 2, "six": 6, "seven": 7}
    coord = GroupCoordinator(lambda t: counts.get(t, 0), EXPIRY_MS)
    subscription = dict.fromkeys(counts, "*")
    held: dict[str, list[tuple[str, int]]] = {m: [] for m in "abc"}
    for step in range(12):  # enough rounds for every hand-off
        for member in "abc":
            got = coord.heartbeat("g", member, client_address="", mode="clustering", subscription=subscription,
                                  held=held[member], now_ms=step).assignment
            held[member] = [(t, q) for t, qs in got.items() for q in qs]
    for topic, count in counts.items():
        per_member = [sum(1 for t, _ in held[m] if t == topic) for m in "abc"]
        assert sum(per_member) == count and max(per_member) - min(per_member) <= 1


def test_coordinator_index_is_stable_and_spread():
    assert coordinator_index("billing", 3) == coordinator_index("billing", 3)
    assert {coordinator_index(f"g{i}", 3) for i in range(30)} == {0, 1, 2}


def test_a_fresh_claim_keeps_other_members_out_until_released_or_lapsed():
    claims = QueueClaims(hold_ms=1000)
    claims.claim("g", "a", TOPIC, 0, now_ms=0, busy_ms=5000)  # a long poll parked for 5 s
    with pytest.raises(QueueHeldError):
        claims.claim("g", "b", TOPIC, 0, now_ms=5500)
    claims.check("other-group", "b", TOPIC, 0, now_ms=1)
    claims.claim("g", "b", TOPIC, 0, now_ms=6001)  # lapsed: b takes it
    with pytest.raises(QueueHeldError):
        claims.check("g", "a", TOPIC, 0, now_ms=6002)  # a zombie's commit is refused
    claims.release("g", "a", [(TOPIC, 0)])  # not a's any more: no effect
    claims.refresh("g", "a", TOPIC, 0, now_ms=6003)
    with pytest.raises(QueueHeldError):
        claims.check("g", "a", TOPIC, 0, now_ms=6004)
    claims.release("g", "b", [(TOPIC, 0)])
    claims.refresh("g", "b", TOPIC, 0, now_ms=6005)  # a long poll answered after the release
    claims.check("g", "a", TOPIC, 0, now_ms=6006)


def test_readers_are_the_members_with_fresh_claims():
    """What an admin reset or group delete on a queue's leader checks, wherever the coordinator is."""
    claims = QueueClaims(hold_ms=1000)
    claims.claim("g", "a", TOPIC, 0, now_ms=0)
    claims.claim("g", "b", TOPIC, 1, now_ms=500)
    claims.claim("other", "c", TOPIC, 2, now_ms=0)
    assert claims.readers("g", now_ms=900) == {"a", "b"}
    assert claims.readers("g", now_ms=900, queues=[(TOPIC, 1), (TOPIC, 2)]) == {"b"}
    assert claims.readers("g", now_ms=1200) == {"b"}  # a's claim lapsed
    claims.release("g", "b", [(TOPIC, 1)])
    assert claims.readers("g", now_ms=1200) == set()
