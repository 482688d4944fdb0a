"""The compaction worker's first step (:mod:`gms.broker.clean_worker`), before it imports
anything else: its start-up (the interpreter's, numpy's and the record modules' imports, a
seventh of a second of CPU) would otherwise run at the broker's own priority, on a core the
broker's request loop and its clients may want. Also a thread's idle priority
(:func:`run_when_idle`, the commitlog warmer's) and the way back for the broker's stop
(:func:`restore_priority`)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import sys
from collections.abc import Iterable

from gms.die_with_parent import set_death_signal

log = logging.getLogger("gms.broker.clean_worker")

WORKER_NICE = 19
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}  # the ioprio_set syscall's number
_IOPRIO_BEST_EFFORT_LOWEST = (2 << 13) | 7  # class best-effort, level 7


def lower_priority(parent_pid: int) -> None:
    """Die with the cleaner's thread; the lowest CPU priority (SCHED_IDLE: it runs on a core
    nothing else wants, and a task that wakes there preempts it at once, where a nice 19 task
    may finish its slice first) and the lowest best-effort IO priority (where the kernel's IO
    scheduler heeds it)."""
    if not set_death_signal(parent_pid):
        sys.exit("the broker is gone")
    os.setpriority(os.PRIO_PROCESS, 0, WORKER_NICE)  # what is left if SCHED_IDLE is refused
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as err:
        log.warning("compaction worker: SCHED_IDLE refused (%s): running at nice %d", err, WORKER_NICE)
    if (number := _IOPRIO_SET.get(platform.machine())) is not None:
        ctypes.CDLL(None).syscall(number, 1, 0, _IOPRIO_BEST_EFFORT_LOWEST)  # IOPRIO_WHO_PROCESS, this process


def run_when_idle(thread_id: int) -> None:
    """Run a thread of this process only on an otherwise idle CPU (SCHED_IDLE; else at the
    lowest nice value)."""
    try:
        os.sched_setscheduler(thread_id, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, thread_id, WORKER_NICE)


def restore_priority(thread_ids: Iterable[int]) -> None:
    """Give threads (native ids, of this process or a child) the normal CPU priority back
    (SCHED_OTHER, nice 0) where this process may raise it (CAP_SYS_NICE or RLIMIT_NICE; else
    nothing changes). For a stop: on a busy machine a SCHED_IDLE thread may wait seconds for a
    CPU, even to end once killed, and the stop waits for it."""
    for thread_id in thread_ids:
        try:
            os.sched_setscheduler(thread_id, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, thread_id, 0)
        except OSError:  # refused, or the thread ended
            continue


def process_threads(pid: int) -> list[int]:
    """The native ids of a process's threads (none if it is gone)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []
