"""Sync-flush sends waiting for their group commit, on the event loop.

A thread future per send (``store.durable_future`` + ``asyncio.wrap_future``) costs one
thread-to-loop wakeup per send and a timer per send. Here the flush thread wakes the loop once
per flush, which releases every send the flush covers, and one timer serves all timeouts: sends
register in append order, so offsets and deadlines both grow from the head of the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gms.broker.store import StoreAPI
from gms.errors import FlushTimeoutError
from gms.store_errors import StoreError


class FlushWaiters:
    def __init__(self, store: StoreAPI, timeout_ms: int) -> None:
        self._store = store
        self._timeout_ms = timeout_ms
        self._waiting: deque[tuple[int, float, asyncio.Future[None]]] = deque()  # (offset, deadline, future)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        store.add_flush_listener(self._on_flush)

    async def wait(self, offset: int) -> None:
        """Return once the commitlog is durable below ``offset``; FlushTimeoutError after the timeout."""
        store = self._store
        if offset <= store.flushed_offset:
            return
        store.request_flush(offset)  # before registering: a refusal leaves nothing behind
        loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        deadline = loop.time() + self._timeout_ms / 1000
        self._waiting.append((offset, deadline, future))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        if offset <= store.flushed_offset:  # flushed meanwhile, perhaps before the flush thread knew the loop
            self._release(store.flushed_offset, None)
        await future

    def _on_flush(self, flushed: int, error: StoreError | None) -> None:
        """Flush thread: hand the news to the loop (always: a send may be registering right now)."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._release, flushed, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _release(self, flushed: int, error: StoreError | None) -> None:
        waiting = self._waiting
        while waiting and (error is not None or waiting[0][0] <= flushed):
            future = waiting.popleft()[2]
            if not future.done():  # a cancelled send (connection lost) is skipped
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def _expire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        waiting, now = self._waiting, loop.time()
        while waiting and waiting[0][1] <= now:
            future = waiting.popleft()[2]
            if not future.done():
                future.set_exception(FlushTimeoutError(
                    f"the flush covering this send did not finish within {self._timeout_ms} ms"))
        if waiting:
            self._timer = loop.call_at(waiting[0][1], self._expire)
