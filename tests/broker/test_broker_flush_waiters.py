"""Sync-flush waiting on the event loop: group commit, timeouts, failures (real store, real files)."""

import asyncio

import pytest

from gms.broker.flush_waiters import FlushWaiters
from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.errors import FlushTimeoutError
from gms.record import encode_record
from gms.store_errors import StoreClosed

RECORD = encode_record(topic="t", body=b"x" * 100)


def open_store(tmp_path, **overrides) -> MessageStore:
    config = StoreConfig(commitlog_file_size_bytes=1 << 20, warm_next_file=False, **overrides)
    store = MessageStore.open(tmp_path / "store", config)
    store.create_topic("t", 1)
    return store


def test_concurrent_sends_share_flushes(tmp_path):
    store = open_store(tmp_path, flush_mode="sync")
    flushes = []
    store.add_flush_listener(lambda offset, error: flushes.append(offset))

    async def scenario():
        waiters = FlushWaiters(store, timeout_ms=5000)

        async def send():
            await waiters.wait(store.append(RECORD).end_phys_offset)

        await asyncio.gather(*(send() for _ in range(200)))

    try:
        asyncio.run(scenario())
        assert store.flushed_offset == store.stats().max_offset
        assert 1 <= len(flushes) < 200  # appends made while a flush runs share the next one
    finally:
        store.close()


def test_wait_times_out_when_no_flush_comes(tmp_path):
    store = open_store(tmp_path, flush_mode="async", flush_interval_ms=60_000)

    async def scenario():
        waiters = FlushWaiters(store, timeout_ms=50)
        first = asyncio.create_task(waiters.wait(store.append(RECORD).end_phys_offset))
        await asyncio.sleep(0.02)
        second = asyncio.create_task(waiters.wait(store.append(RECORD).end_phys_offset))
        with pytest.raises(FlushTimeoutError):
            await first
        assert not second.done()  # its own deadline is later
        with pytest.raises(FlushTimeoutError):
            await second

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_async_mode_waits_for_the_interval_flush(tmp_path):
    store = open_store(tmp_path, flush_mode="async", flush_interval_ms=20)

    async def scenario():
        waiters = FlushWaiters(store, timeout_ms=5000)
        end = store.append(RECORD).end_phys_offset
        await waiters.wait(end)
        assert store.flushed_offset >= end

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_closing_the_store_fails_waiting_sends(tmp_path):
    store = open_store(tmp_path, flush_mode="async", flush_interval_ms=60_000)

    async def scenario():
        waiters = FlushWaiters(store, timeout_ms=5000)
        waiting = asyncio.create_task(waiters.wait(store.append(RECORD).end_phys_offset))
        await asyncio.sleep(0.01)
        await asyncio.to_thread(store.close)  # the final flush covers it
        await waiting
        with pytest.raises(StoreClosed):
            await waiters.wait(10**12)

    asyncio.run(scenario())
