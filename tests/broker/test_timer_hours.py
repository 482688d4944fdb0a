"""Messages scheduled hours ahead, on a real store with the timer service's clock under the
test's control: each fires once, at its time, across restarts (the checkpoint and the rescan),
and none fires early."""

from __future__ import annotations

import asyncio
import time

import pytest

from gms.broker import timers
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_config import StoreConfig
from gms.broker.timers import TimerService
from gms.record import decode_record, encode_record
from gms.record.layout import DELIVER_AT_PROPERTY, FLAG_SCHEDULED, TIMER_FLAGS

HOUR_MS = 3_600_000
CONFIG = StoreConfig(commitlog_file_size_bytes=4 << 20, cq_entries_per_file=1000, warm_next_file=False)


def visible(store: MessageStore) -> list[bytes]:
    """The bodies consumers of the queue would get (delivered copies)."""
    result = store.get("t", 0, 0, 100)
    if result.status is not GetStatus.FOUND:
        return []
    return [decode_record(view).body for view in result.records]


async def run_service(store: MessageStore, path) -> TimerService:
    def append(records: bytes, key: tuple[str, int]) -> None:
        store.append(records, allowed_flags=TIMER_FLAGS)

    service = TimerService(store, path, may_fire=lambda key: True, append=append)
    store.set_timer_listener(service)
    service.start()
    await asyncio.sleep(0)
    return service


async def at(clock: list[int], now: int, service: TimerService) -> None:
    """Move the clock and let the service look at what is due."""
    clock[0] = now
    service.leadership_changed()  # wakes its loop, which reads the (moved) clock
    await asyncio.sleep(0.05)


def test_messages_hours_ahead_fire_once_at_their_time_across_restarts(tmp_path, monkeypatch):
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(timers, "now_ms", lambda: clock[0])
    base = clock[0]
    checkpoint = tmp_path / "timers.json"

    async def scenario() -> None:
        store = MessageStore.open(tmp_path / "store", CONFIG)
        store.create_topic("t", 1)
        service = await run_service(store, checkpoint)
        for hours in (5, 1, 3):
            store.append(encode_record(topic="t", body=b"in %dh" % hours, queue_id=0, flags=FLAG_SCHEDULED,
                                       properties={DELIVER_AT_PROPERTY: str(base + hours * HOUR_MS)}))
        assert service.pending_count == 3
        await at(clock, base + HOUR_MS - 1, service)
        assert visible(store) == []  # a millisecond early: nothing
        await at(clock, base + HOUR_MS, service)
        assert visible(store) == [b"in 1h"]
        await service.stop()
        store.close()

        store = MessageStore.open(tmp_path / "store", CONFIG)  # restarted: two still pending
        service = await run_service(store, checkpoint)
        assert service.pending_count == 2 and service.deliver_at("t", 0, 0) == base + 5 * HOUR_MS
        await at(clock, base + 4 * HOUR_MS, service)
        assert visible(store) == [b"in 1h", b"in 3h"]
        await service.stop()
        store.close()

        store = MessageStore.open(tmp_path / "store", CONFIG)
        service = await run_service(store, checkpoint)
        await at(clock, base + 6 * HOUR_MS, service)
        assert visible(store) == [b"in 1h", b"in 3h", b"in 5h"]
        await service.stop()
        store.close()

        store = MessageStore.open(tmp_path / "store", CONFIG)  # a day later: nothing fires again
        service = await run_service(store, checkpoint)
        await at(clock, base + 24 * HOUR_MS, service)
        assert service.pending_count == 0 and visible(store) == [b"in 1h", b"in 3h", b"in 5h"]
        await service.stop()
        store.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("hours", [2, 48, 7 * 24])
def test_the_wheel_holds_any_delay_up_to_the_maximum(tmp_path, monkeypatch, hours):
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(timers, "now_ms", lambda: clock[0])
    due = clock[0] + hours * HOUR_MS - 1

    async def scenario() -> None:
        store = MessageStore.open(tmp_path / "store", CONFIG)
        store.create_topic("t", 1)
        service = await run_service(store, tmp_path / "timers.json")
        store.append(encode_record(topic="t", body=b"late", queue_id=0, flags=FLAG_SCHEDULED,
                                   properties={DELIVER_AT_PROPERTY: str(due)}))
        await at(clock, due - 1000, service)
        assert visible(store) == []
        await at(clock, due, service)
        assert visible(store) == [b"late"]
        await service.stop()
        store.close()

    asyncio.run(scenario())
