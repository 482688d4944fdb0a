"""Repeated failures log as outages (start, reminder, end with a count); a RepeatFilter lets one
record of each kind through per interval."""

from __future__ import annotations

import logging

import pytest

from gms.log_throttle import Outage, RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_an_outage_logs_its_start_once_then_its_end_with_a_count(caplog, clock):
    outage = Outage(logging.getLogger("gms.test"), "heartbeat of g/m", remind_s=60, clock=clock)
    caplog.set_level(logging.INFO, "gms.test")
    outage.recovered()  # nothing to end
    for _ in range(50):
        outage.failed(ConnectionRefusedError("refused"))
        clock.now += 0.2
    assert outage.active
    outage.recovered()
    outage.recovered()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "heartbeat of g/m failed: refused (repeats are not logged until it recovers)"),
        ("INFO", "heartbeat of g/m recovered after 10.0 s (50 failures)"),
    ]
    assert not outage.active and outage.failures == 0


def test_a_long_outage_is_mentioned_again_each_reminder_period(caplog, clock):
    outage = Outage(logging.getLogger("gms.test"), "etcd keep-alive", remind_s=60, clock=clock)
    caplog.set_level(logging.INFO, "gms.test")
    for _ in range(150):  # 150 s, one failure a second
        outage.failed("down")
        clock.now += 1
    messages = [r.getMessage() for r in caplog.records]
    assert messages[1:] == ["etcd keep-alive still failing after 60 s (61 failures): down",
                            "etcd keep-alive still failing after 120 s (121 failures): down"]


def test_repeat_filter_passes_one_record_per_kind_per_interval(clock):
    repeat = RepeatFilter(interval_s=60, clock=clock)

    def record(msg: str, name: str = "gms.client.rebalance") -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, ("g", "m"), None)

    assert repeat.filter(record("heartbeat of %s/%s failed"))
    assert not any(repeat.filter(record("heartbeat of %s/%s failed")) for _ in range(9))
    assert repeat.filter(record("pull of %s/%s failed"))  # another kind
    assert repeat.filter(record("heartbeat of %s/%s failed", name="gms.other"))  # another source
    clock.now += 61
    again = record("heartbeat of %s/%s failed")
    assert repeat.filter(again)
    assert again.getMessage() == "heartbeat of g/m failed [9 like this in the last 61 s not shown]"
