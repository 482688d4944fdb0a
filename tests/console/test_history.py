"""The console's sample history (pure): rates from consecutive counts, gaps, bounded memory."""

from __future__ import annotations

import pytest

from gms.console.history import History


def test_rates_are_messages_per_second_between_samples() -> None:
    history = History(interval_s=2, window_s=60)
    history.record(100.0, {"orders": 0}, {})
    assert history.topic_rates("orders") == {"t": [], "rate": []} and history.latest_rate("orders") is None
    history.record(102.0, {"orders": 50}, {})
    history.record(104.0, {"orders": 50}, {})
    assert history.topic_rates("orders") == {"t": [102.0, 104.0], "rate": [25.0, 0.0]}
    assert history.latest_rate("orders") == 0.0
    assert history.topic_rates("unknown") == {"t": [], "rate": []} and history.latest_rate("unknown") is None


def test_a_count_going_down_or_a_clock_going_back_is_a_gap() -> None:
    history = History(interval_s=1, window_s=60)
    for t_s, count in ((1.0, 10), (2.0, 3), (1.5, 5), (3.0, 8)):  # recreated; clock stepped back
        history.record(t_s, {"orders": count}, {})
    assert history.topic_rates("orders")["rate"] == [None, None, 2.0]


def test_unread_topics_keep_their_series_and_deleted_ones_lose_it() -> None:
    history = History(interval_s=1, window_s=60)
    history.record(1.0, {"a": 1, "b": 1}, {"g": 5})
    history.record(2.0, {"a": None, "b": 3}, {"g": 4})  # a's brokers did not answer
    history.record(3.0, {"a": 5}, {})  # b and g deleted
    assert history.topic_rates("a") == {"t": [3.0], "rate": [2.0]}
    assert history.topic_rates("b") == {"t": [], "rate": []}
    assert history.group_lag("g") == {"t": [], "lag": []}


def test_history_keeps_the_window_only() -> None:
    history = History(interval_s=5, window_s=20)
    for i in range(100):
        history.record(i * 5.0, {"t": i}, {"g": i})
    assert history.group_lag("g")["t"] == [475.0, 480.0, 485.0, 490.0, 495.0]
    assert len(history.topic_rates("t")["rate"]) == 4


def test_interval_must_fit_the_window() -> None:
    with pytest.raises(ValueError, match="0 < interval_s <= window_s"):
        History(interval_s=10, window_s=5)
