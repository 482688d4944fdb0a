"""The flush thread: group commit in sync mode, Metaq/RocketMQ-style thresholds in async mode.

Sync: every ``durable_future`` or ``request_flush`` wakes the thread, which flushes everything
committed so far and resolves all futures the flush covers (many writers, one fdatasync); it
then tells each listener the new flushed offset once (an event loop waits for many sends with
one wakeup per flush). Async: the thread flushes every ``flush_interval_ms`` when anything is
dirty, and earlier once ``flush_every_messages`` were appended and at least ``flush_least_pages``
pages are dirty.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from gms.broker.store_config import PAGE_SIZE_BYTES, StoreConfig
from gms.store_errors import StoreClosed, StoreError

log = logging.getLogger(__name__)

FlushListener = Callable[[int, StoreError | None], None]  # (flushed offset, failure); flush thread


class FlushService:
    def __init__(self, config: StoreConfig, flush: Callable[[], int], committed: Callable[[], int],
                 flushed_offset: int) -> None:
        """``flush`` makes everything committed durable and returns the new flushed offset."""
        self._config = config
        self._flush = flush
        self._committed = committed
        self.flushed_offset = flushed_offset
        self._cond = threading.Condition()
        self._waiters: list[tuple[int, int, Future]] = []
        self._requested_offset = flushed_offset  # sync: the thread flushes while this is ahead
        self._listeners: list[FlushListener] = []
        self._seq = itertools.count()
        self._unflushed_messages = 0
        self._stopping = False
        self._failure: StoreError | None = None
        self._thread = threading.Thread(target=self._run, name="gms-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_listener(self, listener: FlushListener) -> None:
        """Call ``listener`` (in the flush thread, so it must only hand over) after every flush,
        and with the error once flushing failed or stopped."""
        self._listeners.append(listener)

    def durable_future(self, offset: int) -> Future:
        """A future resolved (with the flushed offset) once everything below ``offset`` is durable."""
        fut: Future = Future()
        if offset <= self.flushed_offset:
            fut.set_result(self.flushed_offset)
            return fut
        with self._cond:
            if self._failure is not None or self._stopping:
                fut.set_exception(self._failure or StoreClosed())
                return fut
            heapq.heappush(self._waiters, (offset, next(self._seq), fut))
            self._request(offset)
        return fut

    def request_flush(self, offset: int) -> None:
        """Have everything below ``offset`` flushed (in sync mode at once; in async mode at the next
        interval) without a future: listeners hear of it. Raises if flushing failed or stopped."""
        if offset <= self.flushed_offset:
            return
        with self._cond:
            if self._failure is not None or self._stopping:
                raise self._failure or StoreClosed()
            self._request(offset)

    def _request(self, offset: int) -> None:
        """(Under the condition.) Record the wanted offset; in sync mode wake the thread."""
        if offset > self._requested_offset:
            self._requested_offset = offset
            if self._config.flush_mode == "sync":
                self._cond.notify()

    def appended(self, message_count: int) -> None:
        if self._config.flush_mode == "sync" or not self._config.flush_every_messages:
            return
        self._unflushed_messages += message_count
        if self._unflushed_messages >= self._config.flush_every_messages:
            dirty_pages = (self._committed() - self.flushed_offset) // PAGE_SIZE_BYTES
            if dirty_pages >= self._config.flush_least_pages:
                self._unflushed_messages = 0
                with self._cond:
                    self._cond.notify()

    def _run(self) -> None:
        interval_s = self._config.flush_interval_ms / 1000
        while True:
            with self._cond:
                requested = self._config.flush_mode == "sync" and self._requested_offset > self.flushed_offset
                if not self._stopping and not requested:
                    self._cond.wait(interval_s)
                stopping = self._stopping
            if stopping:
                return
            self.flush_now()

    def flush_now(self) -> int:
        """Flush and resolve the covered futures; also the final flush of ``stop``."""
        try:
            flushed = self._flush()
        except StoreError as err:
            log.error("flush failed: %s", err)
            self._fail(err)
            return self.flushed_offset
        self.flushed_offset = flushed
        ready = []
        with self._cond:
            while self._waiters and self._waiters[0][0] <= flushed:
                ready.append(heapq.heappop(self._waiters)[2])
        for fut in ready:
            fut.set_result(flushed)
        self._tell_listeners(flushed, None)
        return flushed

    def _tell_listeners(self, flushed: int, error: StoreError | None) -> None:
        for listener in self._listeners:
            try:
                listener(flushed, error)
            except Exception:  # a listener bug must not stop the flush thread
                log.exception("flush listener failed")

    def _fail(self, err: StoreError) -> None:
        with self._cond:
            self._failure = err
            self._requested_offset = self.flushed_offset  # nobody waits any more: no retry loop
            waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            fut.set_exception(err)
        self._tell_listeners(self.flushed_offset, err)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        self.flush_now()
        with self._cond:
            waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            fut.set_exception(StoreClosed())
        self._tell_listeners(self.flushed_offset, StoreClosed())
