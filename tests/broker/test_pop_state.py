"""A group's pop state on one queue (broker.pop.PopQueue): what is done, what is in flight, when
it becomes visible again, and its wire form."""

from __future__ import annotations

import numpy as np

from gms.broker.pop import INFLIGHT_MAX, WINDOW_MAX, PopQueue


def _ack(state: PopQueue, offset: int, attempt: int) -> bool:
    """Whether the one handle held."""
    return not state.ack(np.array([offset]), np.array([attempt]))[0]


def test_acks_in_any_order_move_the_low_offset_past_every_done_one():
    state = PopQueue(10)
    state.hand_out([10, 12, 13], visible_at=1000, next_offset=15)  # 11 and 14 were not the group's
    assert (state.low(), state.next) == (10, 15)
    assert _ack(state, 12, 1) and state.low() == 10
    assert _ack(state, 10, 1) and state.low() == 13
    assert _ack(state, 13, 1) and state.low() == 15
    assert _ack(state, 13, 1) and _ack(state, 11, 1)  # done already: acknowledging again is fine
    assert not _ack(state, 15, 1)  # never handed out


def test_due_messages_go_out_again_with_the_attempt_counted_and_old_handles_expire():
    state = PopQueue(0)
    state.hand_out([0, 1, 2], visible_at=1000, next_offset=3)
    assert state.due(999, 10) == [] and state.next_visible() == 1000
    assert state.due(1000, 2) == [0, 1]  # at most the limit; the rest stays due
    assert state.redeliver([0, 1], visible_at=5000) == [2, 2]
    assert state.due(1000, 10) == [2]  # taken: the caller hands it out again (or drops it)
    assert state.redeliver([2], visible_at=9000) == [2]
    assert not _ack(state, 0, 1) and not state.change_invisible(1, 1, 9000)  # the first delivery's handles
    assert _ack(state, 0, 2)
    assert state.change_invisible(1, 2, 9000)  # later than its heap entry at 5000: that one is skipped
    assert state.due(8999, 10) == [] and state.next_visible() == 9000
    assert state.due(9000, 10) == [1, 2]


def test_the_wire_form_round_trips_and_is_cut_to_the_committed_offset_and_the_queue():
    state = PopQueue(0)
    state.hand_out([0, 1, 2, 3], visible_at=1000, next_offset=5)
    _ack(state, 1, 1)
    state.redeliver([3], visible_at=2000)
    wire = state.wire()
    same = PopQueue.from_wire(wire, committed=0, low=0, high=100)
    assert same.wire() == wire and same.low() == 0 and same.due(1000, 10) == [0, 2]
    cut = PopQueue.from_wire(wire, committed=2, low=0, high=3)  # committed later; the queue was cut at 3
    assert cut.wire() == [3, [2, 1, 1000]]
    past = PopQueue.from_wire(wire, committed=0, low=50, high=100)  # retention passed it all
    assert past.wire() == [50, []]


def test_room_is_bounded_by_messages_in_flight_and_by_the_window_behind_the_oldest():
    state = PopQueue(0)
    assert state.room() == min(INFLIGHT_MAX, WINDOW_MAX)
    state.hand_out([0], visible_at=1000, next_offset=WINDOW_MAX - 5)  # offset 0 stuck in flight
    assert state.room() == 5
    _ack(state, 0, 1)
    assert state.room() == INFLIGHT_MAX


def test_an_ack_request_is_checked_as_a_whole_without_a_step_per_message():
    state = PopQueue(0)
    state.hand_out(list(range(100)), visible_at=1000, next_offset=100)
    state.redeliver([5], visible_at=2000)
    stale = state.ack(np.array([1, 1, 5, 5, 7, 200]), np.array([1, 1, 1, 2, 1, 1]))
    assert stale.tolist() == [False, False, True, False, False, True]  # a repeat is fine; 5@1 and 200 are not
    assert state.attempt(1) is None and state.attempt(5) is None and state.attempt(2) == 1
