"""The store's side of scheduled messages: hidden records are indexed apart (pulls skip them),
the timer hears of every timer record appended, a restart's rescan finds them, and producers
cannot send the broker's flags."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from store_helpers import small_config

from gms.broker.store import GetStatus, MessageStore, TimerRecord
from gms.broker.timers import TimerService
from gms.record import decode_record, encode_record
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_SCHEDULED,
    FLAG_TIMER_CANCEL,
    FLAG_TIMER_COPY,
    ORIGIN_PROPERTY,
    TIMER_FLAGS,
)
from gms.store_errors import InvalidRecord


class Heard:
    def __init__(self) -> None:
        self.records: list[TimerRecord] = []

    def appended(self, records: list[TimerRecord]) -> None:
        self.records += records

    def truncated(self, topic: str, queue_id: int) -> None:
        pass

    def deleted(self, topic: str) -> None:
        pass


def scheduled(body: bytes, in_ms: int = 60_000) -> bytes:
    return encode_record(topic="t", body=body, flags=FLAG_SCHEDULED,
                         properties={DELIVER_AT_PROPERTY: str(int(time.time() * 1000) + in_ms)})


def test_hidden_records_are_skipped_heard_and_found_again(store):
    heard = Heard()
    store.set_timer_listener(heard)
    store.append(encode_record(topic="t", body=b"plain-0"))
    store.append(scheduled(b"later") + encode_record(topic="t", body=b"plain-2"))  # a batch of two
    store.append(encode_record(topic="t", body=b"later", flags=FLAG_TIMER_COPY, properties={ORIGIN_PROPERTY: "1"}),
                 allowed_flags=TIMER_FLAGS)
    store.append(scheduled(b"cancelled"))
    store.append(encode_record(topic="t", body=b"\0", flags=FLAG_TIMER_CANCEL, properties={ORIGIN_PROPERTY: "4"}),
                 allowed_flags=TIMER_FLAGS)
    got = store.get("t", 0, 0, 100)
    assert got.status is GetStatus.FOUND
    assert [bytes(decode_record(r).body) for r in got.records] == [b"plain-0", b"plain-2", b"later"]
    expected = [(1, FLAG_SCHEDULED), (3, FLAG_TIMER_COPY), (4, FLAG_SCHEDULED), (5, FLAG_TIMER_CANCEL)]
    assert [(r.queue_offset, r.flags) for r in heard.records] == expected
    assert [(r.queue_offset, r.flags) for r in store.timer_records("t", 0, 0)] == expected
    # From past the first scheduled record, copies before the next hidden one are not read.
    assert [(r.queue_offset, r.flags) for r in store.timer_records("t", 0, 2)] == expected[2:]
    assert bytes(decode_record(store.read_entry("t", 0, 1)).body) == b"later"  # hidden, still readable


@pytest.mark.parametrize("flags", [FLAG_TIMER_COPY, FLAG_TIMER_CANCEL, 0x100])
def test_producers_may_send_only_the_scheduled_flag(store, flags):
    with pytest.raises(InvalidRecord, match="flags"):
        store.append(encode_record(topic="t", body=b"x", flags=flags, properties={ORIGIN_PROPERTY: "0"}))
    with pytest.raises(InvalidRecord, match="flags"):  # the batch path too
        store.append(encode_record(topic="t", body=b"ok") + encode_record(topic="t", body=b"x", flags=flags))
    assert store.max_offset("t", 0) == 0


def test_a_restart_rescans_and_checkpoints_only_the_queues_that_hold_records(store_dir):
    """Thousands of empty queues cost a restart nothing: the timer's rescan and its checkpoint
    walk the queues the store opened (those with entries), not every queue of every topic, and
    the scheduled record on the one queue written is still found pending."""
    first = MessageStore.open(store_dir, small_config())
    try:
        first.create_topic("t", 64)
        first.append(encode_record(topic="t", body=b"plain", queue_id=3))
        first.append(encode_record(topic="t", body=b"later", queue_id=41, flags=FLAG_SCHEDULED,
                                   properties={DELIVER_AT_PROPERTY: str(int(time.time() * 1000) + 600_000)}))
    finally:
        first.close()

    checkpoint = store_dir.parent / "timers.json"

    async def restart() -> tuple[int | None, list[tuple[str, int]]]:
        store = MessageStore.open(store_dir, small_config())
        timers = TimerService(store, checkpoint, may_fire=lambda key: True, append=lambda record, key: None)
        try:
            timers.start()
            low = timers.low("t", 41)
            await timers.stop()  # saves the checkpoint
            return low, sorted(store.queues_opened())
        finally:
            store.close()

    low, opened = asyncio.run(restart())
    assert low == 0  # pending again, from the rescan
    assert opened == [("t", 3), ("t", 41)]  # the 62 empty queues were not opened for it
    assert json.loads(checkpoint.read_bytes()) == {"t/3": 1, "t/41": 0}
