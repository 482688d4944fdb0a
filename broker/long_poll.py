"""Long polling: pulls at the end of a queue park here until a message arrives.

A pull that finds nothing registers a future for its queue and waits (bounded);
every append wakes the futures of the queues it touched, and the pull runs
again.  Waking is per queue, not per message, so a batch costs one wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

QueueKey = tuple[str, int]


class PullWaiters:
    def __init__(self) -> None:
        self._waiters: dict[QueueKey, list[asyncio.Future[None]]] = {}
        self.closed = False

    async def wait(self, key: QueueKey, timeout_s: float) -> bool:
        """Wait until ``key`` gets a message; False when the timeout ran out first or we closed."""
        return await self.wait_any((key,), timeout_s)

    async def wait_any(self, keys: Iterable[QueueKey], timeout_s: float) -> bool:
        """Wait until any of ``keys`` gets a message; False when the timeout ran out first or we closed."""
        if self.closed:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for key in keys:
            self._waiters.setdefault(key, []).append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    if future in waiters:
                        waiters.remove(future)
                    if not waiters:
                        del self._waiters[key]

    def notify(self, keys: Iterable[QueueKey]) -> None:
        for key in keys:
            for future in self._waiters.pop(key, ()):
                if not future.done():
                    future.set_result(None)

    def close(self) -> None:
        """Release every parked pull and refuse new waits (the broker is stopping)."""
        self.closed = True
        self.notify(list(self._waiters))

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiters.values())
