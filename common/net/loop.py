"""Event loops: uvloop when installed, and a loop in a thread for synchronous callers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from gms.errors import RequestTimeoutError

try:  # uvloop roughly halves per-request overhead; it is optional (absent on Windows).
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")

LOOP_STOP_TIMEOUT_MS = 5000


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is importable, else the default asyncio loop."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on :func:`new_event_loop`, without touching the global loop policy."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


class LoopThread:
    """An event loop running in a daemon thread, driven from other threads.

    The SDK is one async core with a thin synchronous facade: the facade owns a LoopThread
    and turns each call into ``loop_thread.run(coro, timeout_ms)``. Thread-safe.
    """

    def __init__(self, *, name: str = "gms-io") -> None:
        self._loop = new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._started.set)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future is usable from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_ms: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result; cancel it on timeout."""
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise RuntimeError("LoopThread.run() from the loop's own thread would deadlock")
        future = self.submit(coro)
        try:
            return future.result(None if timeout_ms is None else timeout_ms / 1000)
        except concurrent.futures.TimeoutError as err:
            if future.done():  # the coroutine itself raised a TimeoutError
                raise
            future.cancel()
            raise RequestTimeoutError(f"no result within {timeout_ms} ms") from err

    def stop(self, timeout_ms: float = LOOP_STOP_TIMEOUT_MS) -> None:
        """Cancel what still runs on the loop, stop it and join the thread. Idempotent."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self.submit(self._cancel_tasks()).result(timeout_ms / 1000)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_ms / 1000)
        # uvloop closes (warning) the transports still open here and fails with EBUSY if one was
        # mid-close: whoever opens a connection on this loop closes it and waits for it first.
        self._loop.close()

    async def _cancel_tasks(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._loop.shutdown_asyncgens()
        await asyncio.sleep(0)  # one more turn: transports the cancelled tasks closed release their handles

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
