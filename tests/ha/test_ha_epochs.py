"""Leader-epoch histories and the leader's bookkeeping of followers (pure, no I/O)."""

from __future__ import annotations

import asyncio

from gms.broker.ha.epochs import UNDEFINED_EPOCH, EpochEnd, EpochHistory
from gms.broker.ha.partition import Partition
from gms.broker.ha.state_file import ReplicationStateFile


def test_assign_keeps_epochs_increasing_and_drops_empty_ones():
    h = EpochHistory()
    assert h.assign(0, 0)
    assert h.assign(1, 10)
    assert not h.assign(1, 12)  # same epoch again
    assert not h.assign(0, 20)  # an older epoch
    assert h.assign(3, 10)  # epoch 1 wrote nothing before epoch 3 started at the same offset
    assert h.to_list() == [[0, 0], [3, 10]]


def test_end_for_answers_the_largest_known_epoch_not_above_the_one_asked():
    h = EpochHistory([(0, 0), (2, 10), (5, 30)])
    assert h.end_for(0, 50) == EpochEnd(0, 10)
    assert h.end_for(1, 50) == EpochEnd(0, 10)  # epoch 1 unknown here: where 0 ends
    assert h.end_for(2, 50) == EpochEnd(2, 30)
    assert h.end_for(5, 50) == EpochEnd(5, 50)  # the latest epoch ends at the log end
    assert h.end_for(9, 50) == EpochEnd(5, 50)
    assert EpochHistory([(3, 7)]).end_for(1, 9) == EpochEnd(UNDEFINED_EPOCH, 7)


def test_truncate_forgets_epochs_starting_at_or_after_the_cut():
    h = EpochHistory([(0, 0), (2, 10), (5, 30)])
    h.truncate_from(30)
    assert h.to_list() == [[0, 0], [2, 10]]
    h.truncate_from(5)
    assert h.to_list() == [[0, 0]]


def test_state_file_round_trip(tmp_path):
    f = ReplicationStateFile(tmp_path / "config" / "replication.json")
    assert f.load() == ({}, {})
    f.save({("t", 0): [[0, 0], [1, 5]]}, {("t", 0): 4, ("t", 1): 9}).result()
    # Each save hands over what changed: the queues it does not name stay as written.
    f.save({("u", 0): [[2, 0]]}, {("u", 0): 1}).result()
    f.save({}, {("t", 1): 10}, removed={("u", 0)}).result()
    f.close()
    epochs, hws = ReplicationStateFile(tmp_path / "config" / "replication.json").load()
    assert {k: h.to_list() for k, h in epochs.items()} == {("t", 0): [[0, 0], [1, 5]], ("t", 1): []}
    assert hws == {("t", 0): 4, ("t", 1): 10}


def test_hw_is_the_lowest_isr_log_end_and_releases_waiters():
    async def main():
        p = Partition(("t", 0), EpochHistory(), isr=("a", "b", "c"), replicas=("a", "b", "c"))
        waiter = p.wait_for_hw(5)
        p.record_fetch("b", 7, 10, now_s=1.0)
        assert not p.advance_hw("a", 10)  # c has not fetched: the HW stays
        p.record_fetch("c", 5, 10, now_s=1.0)
        assert p.advance_hw("a", 10) and p.hw == 5
        await asyncio.wait_for(waiter, 1)
        p.isr = ("a", "b")
        assert p.advance_hw("a", 10) and p.hw == 7
        p.isr = ("a", "b", "c")
        assert not p.advance_hw("a", 10) and p.hw == 7  # never moves back

    asyncio.run(main())


def test_lagging_and_rejoining_follow_the_caught_up_time():
    p = Partition(("t", 0), EpochHistory(), isr=("a", "b"), replicas=("a", "b", "c"), hw=10)
    p.record_fetch("b", 10, 10, now_s=0.0)  # caught up at 0
    p.record_fetch("c", 4, 10, now_s=0.0)
    assert p.lagging("a", now_s=5.0, lag_max_s=10.0) == ()
    p.record_fetch("b", 10, 20, now_s=8.0)  # the leader moved on to 20
    p.record_fetch("b", 20, 30, now_s=12.0)  # behind again, but has what the leader had at 8
    assert p.lagging("a", now_s=15.0, lag_max_s=10.0) == ()
    assert p.lagging("a", now_s=19.0, lag_max_s=10.0) == ("b",)
    assert p.rejoining(now_s=1.0, lag_max_s=10.0) == ()  # c is below the HW
    p.record_fetch("c", 10, 10, now_s=2.0)
    assert p.rejoining(now_s=3.0, lag_max_s=10.0) == ("c",)
