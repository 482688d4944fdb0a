"""The scheduled records pending on one queue (broker.timers.PendingQueue): lookups, removal,
the lowest pending offset, compaction, and records followed out of order or twice."""

from __future__ import annotations

from gms.broker.timers import PendingQueue


def test_pending_records_are_found_until_delivered_and_the_low_offset_follows():
    pending = PendingQueue()
    for offset in range(0, 100, 2):
        pending.add(offset, 1000 + offset)
    assert len(pending) == 50 and pending.at(10) == 1010 and pending.at(11) is None and pending.at(500) is None
    pending.remove(0)
    pending.remove(4)
    pending.remove(11)  # not pending: nothing happens
    assert len(pending) == 48 and pending.low() == 2 and pending.at(4) is None
    pending.remove(2)
    assert pending.low() == 6


def test_compaction_keeps_exactly_the_pending_ones():
    pending = PendingQueue()
    for offset in range(10_000):
        pending.add(offset, offset)
    for offset in range(10_000):
        if offset % 3:
            pending.remove(offset)
    assert len(pending) == 3334
    assert [o for o in range(10_000) if pending.at(o) is not None] == list(range(0, 10_000, 3))
    assert pending.low() == 0


def test_a_record_followed_out_of_order_or_again_is_pending_once():
    pending = PendingQueue()
    pending.add(5, 50)
    pending.add(3, 30)  # a rescan may follow from lower down
    pending.add(5, 55)  # followed again: its time is the one stored
    assert len(pending) == 2 and pending.low() == 3 and pending.at(5) == 55
    pending.remove(3)
    pending.add(3, 31)  # a rescan sees it again before its copy
    assert pending.low() == 3 and pending.at(3) == 31
