"""Feeds the console's :class:`History`: every interval, in a worker thread, each topic's appended
count and each group's total lag, read through :class:`ConsoleData`.

A cluster that is down makes gaps in the charts and one outage in the log (not a warning per
sample); the pages report the error themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gms.console.data import ConsoleData
from gms.console.history import History
from gms.errors import GmsError
from gms.log_throttle import Outage

log = logging.getLogger("gms.console")


class Sampler:
    """Runs on the console's event loop between :meth:`start` and :meth:`stop`."""

    def __init__(self, data: ConsoleData, history: History, *, clock: Callable[[], float] = time.time) -> None:
        self._data = data
        self._history = history
        self._clock = clock
        self._outage = Outage(log, "reading the cluster for the console's charts")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gms-console-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def sample_once(self) -> None:
        """Read every topic's count and every group's lag and record them (blocking)."""
        t_s = self._clock()
        appended = {row["topic"]: row["appended"] for row in self._data.topics()}
        lag = {row["group"]: row["lag"] for row in self._data.groups()}
        self._history.record(t_s, appended, lag)

    async def _run(self) -> None:
        interval_s = self._history.interval_s
        while True:
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.sample_once)
            except GmsError as err:  # the cluster or a broker is down: a gap in the charts
                self._outage.failed(err)
            except Exception:  # a bug: say so, and keep the charts going
                log.exception("sampling the cluster failed unexpectedly")
            else:
                self._outage.recovered()
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
