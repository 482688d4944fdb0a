"""Ctrl-C as a request to stop, for commands that run until interrupted (``gms tail -f``).

A KeyboardInterrupt raised at an arbitrary point of the polling thread can land between taking
and releasing a lock the SDK's I/O thread also takes (the fetch buffer's): the I/O loop then
blocks for good and closing the consumer hangs. So the first SIGINT or SIGTERM only sets a flag
the command's loop checks between polls; a second SIGINT interrupts at once, as usual.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


@contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """An event set by the first SIGINT or SIGTERM while the block runs (main thread only)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
