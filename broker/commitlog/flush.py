"""The flush thread: group commit in sync mode, Metaq/RocketMQ-style thresholds in async mode.

Sync: every ``durable_future`` or ``request_flush`` wakes the thread, which flushes everything
committed so far and resolves all futures the flush covers (many writers, one fdatasync); it
then tells each listener the new flushed offset once (an event loop waits for many sends with
one wakeup per flush). Async: the thread flushes every ``flush_interval_ms`` when anything is
dirty, and earlier once ``flush_every_messages`` were appended and at least ``flush_least_pages``
pages are dirty.

Fail-stop: the first failed data flush (:class:`StoreIOError`) fails every waiting future with
:class:`StoreReadOnly`, and nothing is flushed again until restart (the kernel may have dropped
the pages that failed, so a later fsync that succeeds proves nothing). A flush that could not
start for want of a descriptor, and any other error, is logged and retried at the next
interval: the thread never dies.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from prometheus_client import Counter, Histogram

from gms.broker.store_config import PAGE_SIZE_BYTES, StoreConfig
from gms.store_errors import StoreClosed, StoreError, StoreIOError, StoreReadOnly

log = logging.getLogger(__name__)

FlushListener = Callable[[int, StoreError | None], None]  # (flushed offset, failure); flush thread
# Errors of opening a file for its fdatasync: nothing was written or lost, so retry, never fail-stop.
_COULD_NOT_START = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
FLUSH_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


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
        self._failure: StoreReadOnly | None = None  # set once, by the first failed flush
        self._thread = threading.Thread(target=self._run, name="gms-flush", daemon=True)
        # Metrics (registered by the broker's registry): flushes that wrote something, failures.
        self.latency = Histogram("gms_broker_flush_seconds", "Commitlog flushes (fdatasync) that wrote data",
                                 buckets=FLUSH_BUCKETS_S, registry=None)
        self.errors = Counter("gms_broker_flush_errors", "Flushes that failed (a failed fsync makes the store"
                              " read-only; others are retried)", registry=None)

    def start(self) -> None:
        self._thread.start()

    @property
    def failure(self) -> StoreReadOnly | None:
        """The fail-stop error once a flush failed, else None."""
        return self._failure

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
        retry_later = False
        while True:
            with self._cond:
                requested = self._config.flush_mode == "sync" and self._requested_offset > self.flushed_offset
                if not self._stopping and (retry_later or not requested):
                    self._cond.wait(interval_s)
                stopping = self._stopping
            if stopping:
                return
            try:
                self.flush_now()
                retry_later = False
            except Exception:  # async mode would never flush again: log, retry after an interval
                self.errors.inc()
                log.exception("flush failed; retrying in %d ms", self._config.flush_interval_ms)
                retry_later = True

    def flush_now(self) -> int:
        """Flush and resolve the covered futures; also the final flush of ``stop``. After a
        failed flush nothing is flushed any more (fail-stop)."""
        if self._failure is not None:
            return self.flushed_offset
        started = time.perf_counter()
        try:
            flushed = self._flush()
        except StoreIOError as err:
            cause = err.__cause__
            if isinstance(cause, OSError) and cause.errno in _COULD_NOT_START:
                raise
            self.fail(err)
            return self.flushed_offset
        if flushed > self.flushed_offset:
            self.latency.observe(time.perf_counter() - started)
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

    def fail(self, err: StoreIOError) -> None:
        """Fail-stop after a failed fsync (also of an index file, by the store): every waiting
        future fails, and flushing, waiting and requesting flushes are refused from now on."""
        self.errors.inc()
        with self._cond:
            if self._failure is not None:
                return
            failure = self._failure = StoreReadOnly(str(err))
            self._requested_offset = self.flushed_offset  # nobody waits any more: no retry loop
            waiters, self._waiters = self._waiters, []
        failure.__cause__ = err
        log.error("%s", failure)
        for _, _, fut in waiters:
            fut.set_exception(failure)
        self._tell_listeners(self.flushed_offset, failure)

    def stop(self) -> int:
        """Stop the thread after a final flush; returns the flushed offset."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self.flush_now()
        except Exception:  # the waiters below must still hear; the caller sees the offset short
            log.exception("final flush failed")
        with self._cond:
            waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            fut.set_exception(StoreClosed())
        self._tell_listeners(self.flushed_offset, StoreClosed())
        return self.flushed_offset
