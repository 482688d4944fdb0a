"""The commitlog's warmer: pre-faults commitlog files on a thread that runs only on a CPU nothing
else wants (Linux's SCHED_IDLE), one job after the other.

Warming is an optimisation, and its first touch of a GiB must not take the cores serving sends
and pulls (on a 2-core virtual machine it halved a benchmark's throughput while it ran). But a
SCHED_IDLE thread on a busy machine may not run for seconds at a time, and a stop must not wait
for it: a broker started shortly before its stop (after a failover, say) is still warming its
active file then, and closing the store used to wait for that job (a ``ThreadPoolExecutor``'s
shutdown, then its thread at the exit) -- one SIGTERM took tens of seconds, over 60 s with one
busy process on the broker's core. So:

- the thread lives only while there are jobs (a file to warm at the start and at each roll): a
  SCHED_IDLE thread, even a sleeping one, must get a CPU to end when the process exits;
- :meth:`Warmer.close` drops the jobs not started; the job under way gives up at its next look
  (the commitlog is closed, see ``CommitLog.close``), its thread given back the normal priority
  for those last steps where the process may (CAP_SYS_NICE or RLIMIT_NICE), and is waited for at
  most ``CLOSE_WAIT_S``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from gms.broker.worker_priority import restore_priority, run_when_idle

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 5.0  # how long a close waits for the job under way to give up


class Warmer:
    """Runs the jobs handed to :meth:`submit` in order, on an idle-priority daemon thread."""

    def __init__(self, name: str = "gms-warm") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._jobs: deque[Callable[[], object]] = deque()
        self._thread: threading.Thread | None = None  # while there are jobs
        self._closed = False

    def submit(self, job: Callable[[], object]) -> None:
        """Run ``job`` once the jobs before it are done (never, once closed)."""
        with self._lock:
            if self._closed:
                return
            self._jobs.append(job)
            if self._thread is None:
                thread = self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()
                if thread.native_id is not None:  # lowered from here: it may not run for a while
                    run_when_idle(thread.native_id)

    def close(self) -> None:
        """Drop the jobs not started, and let the one under way finish at the normal priority
        where the process may raise it (see the module's docstring); returns at once."""
        with self._lock:
            self._closed = True
            self._jobs.clear()
            thread = self._thread
        if thread is not None and thread.native_id is not None:
            restore_priority([thread.native_id])

    def join(self) -> None:
        """After :meth:`close`, once the job under way was told to stop: wait for its thread to
        end, at most CLOSE_WAIT_S."""
        thread = self._thread
        if thread is None:
            return
        thread.join(CLOSE_WAIT_S)
        if thread.is_alive():
            log.warning("the commitlog warmer did not end within %s s (no CPU to spare): exiting without it",
                        CLOSE_WAIT_S)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception as err:  # noqa: BLE001 - an optimisation: the writer creates what it needs itself
                log.warning("warming a commitlog file failed: %s", err)

