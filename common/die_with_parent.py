"""Start child programs that the kernel kills when their parent dies (Linux PR_SET_PDEATHSIG).

The death signal has to be set inside the child before it runs the program. Doing that in a
``preexec_fn`` makes ``subprocess`` fork instead of vfork, and the forked child then runs the
parent's fork handlers -- grpc's among them, against the parent's live poller threads (a restarted
etcd once died of SIGABRT in grpc's epoll poller that way). So the child runs this module instead: a
fresh interpreter sets the death signal on itself and execs the real program, which keeps it.

The signal follows the *thread* that started the child: start children from a long-lived thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def dying_with_parent(args: Sequence[str]) -> list[str]:
    """``args`` wrapped so the program gets SIGKILL when this process dies (unchanged off Linux)."""
    if not sys.platform.startswith("linux"):
        return list(args)
    return [sys.executable, "-P", "-m", __name__, str(os.getpid()), "--", *args]


def set_death_signal(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when the thread that started it ends (Linux); False
    when ``parent_pid`` is gone already (it died before the signal was set). OSError if refused."""
    libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols, libc's among them
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    return os.getppid() == parent_pid


def main(argv: Sequence[str]) -> None:
    parent, separator, *program = argv
    if separator != "--" or not program:
        sys.exit(f"usage: python -m {__name__} PARENT_PID -- PROGRAM [ARGS...]")
    try:
        parent_alive = set_death_signal(int(parent))
    except OSError as err:
        sys.exit(err.strerror)
    if not parent_alive:
        sys.exit(0)  # the parent died before the death signal was set: nobody wants the program now
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
