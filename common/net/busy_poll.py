"""Busy polling: poll for the next packet for a short while instead of sleeping.

On a virtual machine a thread that sleeps until a packet arrives costs 20-30 µs to wake: its
idle vCPU has halted, and waking it takes an interrupt through the hypervisor. A loopback
round trip between two processes that both sleep is then ~55 µs, of which only ~10 µs is the
work. After a response, a client's next request usually follows within tens of µs, and a
client's answer within the server's handling time: polling the socket without sleeping for
that long catches them awake. The kernel's SO_BUSY_POLL does the same in the network driver,
but not for loopback or most virtual NICs, so gms does it in user space, on both sides:

- a server's event loop keeps polling (without a timeout) for ``window_us`` after each read or
  write (:class:`LoopBusyPoll`);
- a client waiting for one response polls its socket for up to ``window_us`` before it blocks
  (:func:`recv_polling`).

The price is CPU: at most ``window_us`` per gap between requests, none while busy anyway.
Each turn of a poll yields the CPU to any other runnable thread first, so polling never holds
up other work on the core (on a 2-core machine, without the yields, a client and a broker
polling at once left the kernel's writeback no core: W3's p99 went from ~155 to ~260 µs). A
window of 0 turns it off.

Polling pays only while a CPU would otherwise idle. When other tasks want every CPU (a loaded
machine), each yield hands the CPU to one of them for its whole time slice, milliseconds, where a
thread that had blocked would have been woken by its packet ahead of them: beside a loaded
2-core machine's other work W3's p99 was 5-8 ms polling and ~150 µs without. So when yields
keep losing the CPU for ``YIELD_LOST_US`` or more (``LOST_YIELDS_TO_PAUSE`` of them within
``CONTENDED_WINDOW_S``), all polling in the process pauses for ``CONTENDED_PAUSE_S``; then it is
tried again. One lost yield is no contention: on a quiet machine the broker's flush thread or a
collection takes a CPU for a while now and then, and pausing at each (once a second or so) cost
W3 half its polling: p50 57 -> 84 µs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import deque
from typing import ClassVar

# Defaults. A server polls past its response until the client's next request (a send's result
# is made and the next record encoded in ~20-30 µs); a client polls through the server's
# handling of its request (~40 µs for a single send here, more under load).
SERVER_WINDOW_US = 50
CLIENT_WINDOW_US = 150
_NS_PER_US = 1000
_DONTWAIT = socket.MSG_DONTWAIT
# A yield that kept the CPU from this thread this long gave it to another task's time slice: no
# peer's handling of a small request takes that long (~50 µs here), a slice lasts milliseconds.
YIELD_LOST_US = 500
LOST_YIELDS_TO_PAUSE = 3
CONTENDED_WINDOW_S = 0.1
CONTENDED_PAUSE_S = 1.0


class _Pause:
    until_ns = 0  # no polling in this process before then (monotonic ns)
    lost: ClassVar[deque[int]] = deque(maxlen=LOST_YIELDS_TO_PAUSE)  # when the latest lost yields ended


def _yield_cpu() -> bool:
    """Yield the CPU to any other runnable thread; False if it was lost for ``YIELD_LOST_US`` or
    more (the poll stops; if such yields keep coming, the machine is contended and polling
    pauses: see the module's doc)."""
    before = time.monotonic_ns()
    os.sched_yield()
    after = time.monotonic_ns()
    if after - before < YIELD_LOST_US * _NS_PER_US:
        return True
    lost = _Pause.lost
    lost.append(after)
    if len(lost) < LOST_YIELDS_TO_PAUSE or after - lost[0] > CONTENDED_WINDOW_S * 1e9:
        return False  # this poll ends (its window has passed anyway); polling goes on
    lost.clear()
    _Pause.until_ns = after + int(CONTENDED_PAUSE_S * 1e9)
    return False


class LoopBusyPoll:
    """Keeps an event loop polling, not sleeping, until ``window_us`` after the last :meth:`touch`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window_us: int) -> None:
        if window_us < 0:
            raise ValueError(f"the busy-poll window must be >= 0 µs, not {window_us}")
        self._loop = loop
        self._window_ns = window_us * _NS_PER_US
        self._until_ns = 0
        self._polling = False

    def touch(self) -> None:
        """I/O happened: poll for the window from now."""
        if not self._window_ns:
            return
        now = time.monotonic_ns()
        if now < _Pause.until_ns:
            return
        self._until_ns = now + self._window_ns
        if not self._polling:
            self._polling = True
            self._loop.call_soon(self._turn)

    def _turn(self) -> None:
        # A ready callback makes the loop's next poll return at once (a zero timeout). The loop's
        # clock is no use here: uvloop's counts whole milliseconds.
        if time.monotonic_ns() < self._until_ns and _yield_cpu():
            self._loop.call_soon(self._turn)
        else:
            self._polling = False


# One thread of a process polls at a time: a polling thread takes the GIL back right after
# each receive, so threads woken by their own answers would wait for it (up to the interpreter's
# 5 ms switch interval). With 64 threads sending one message at a time, all polling made sends
# several times slower; the others block as usual.
_polling = threading.Lock()


def recv_polling(sock: socket.socket, buffer: bytearray, window_us: int) -> int | None:
    """Receive into ``buffer`` what has arrived on the blocking ``sock``, polling for up to
    ``window_us`` for something to arrive: the bytes received (0 at end of stream), or None if
    nothing came, another thread is polling or polling is paused (then block as usual). Not for
    TLS sockets (their recv takes no flags)."""
    if time.monotonic_ns() < _Pause.until_ns or not _polling.acquire(blocking=False):
        return None
    try:
        deadline_ns = time.monotonic_ns() + window_us * _NS_PER_US
        recv_into = sock.recv_into
        while True:
            try:
                return recv_into(buffer, 0, _DONTWAIT)
            except BlockingIOError:
                if time.monotonic_ns() >= deadline_ns or not _yield_cpu():
                    return None
    finally:
        _polling.release()
