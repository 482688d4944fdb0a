"""Long polling: reads at the end of their queues park here until a message arrives.

A read that finds nothing registers one waiter for all the queues it reads (a PULL one, a POP
or FETCH many) and waits (bounded); every append wakes the waiters of the queues it touched, and
the read runs again. Waking is per queue, not per message, so a batch costs one wake-up; a
waiter learns which of its queues were woken, so a FETCH of thousands of queues reads only those
again. Registering and leaving cost O(1) per queue (sets), a wake-up O(waiters of that queue).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

QueueKey = tuple[str, int]


class _Waiter:
    __slots__ = ("future", "woken")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.woken: set[QueueKey] = set()


class PullWaiters:
    def __init__(self) -> None:
        self._waiters: dict[QueueKey, set[_Waiter]] = {}
        self.closed = False
        self._parked = 0

    async def wait(self, key: QueueKey, timeout_s: float) -> bool:
        """Wait until ``key`` gets a message; False when the timeout ran out first or we closed."""
        return bool(await self.wait_any((key,), timeout_s))

    async def wait_any(self, keys: Iterable[QueueKey], timeout_s: float) -> set[QueueKey]:
        """Wait until any of ``keys`` gets a message: the keys woken meanwhile (empty when the
        timeout ran out first or we closed)."""
        if self.closed:
            return set()
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        keys = list(keys)
        for key in keys:
            self._waiters.setdefault(key, set()).add(waiter)
        self._parked += 1
        try:
            await asyncio.wait_for(waiter.future, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._parked -= 1
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[key]
        return waiter.woken

    def notify(self, keys: Iterable[QueueKey]) -> None:
        for key in keys:
            for waiter in self._waiters.pop(key, ()):
                waiter.woken.add(key)
                if not waiter.future.done():
                    waiter.future.set_result(None)

    def close(self) -> None:
        """Release every parked read and refuse new waits (the broker is stopping)."""
        self.closed = True
        self.notify(list(self._waiters))

    def __len__(self) -> int:
        """The reads parked now."""
        return self._parked
