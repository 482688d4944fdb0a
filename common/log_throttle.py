"""Repeated failures as outages in the log: a line when they start, a line when they end.

A client retrying a dead broker every few hundred milliseconds, or a broker whose etcd is down,
would otherwise write the same warning many times a second and bury everything else.

- :class:`Outage`, for code that knows both failure and success: the first failure is logged
  (WARNING), repeats are counted, a reminder comes every ``remind_s`` while it lasts, and the
  first success logs how long it lasted and how many failures it held (INFO: good news, and a
  command-line tool showing warnings only shows the outage once).
- :class:`RepeatFilter`, a ``logging.Filter`` for a handler: lets the first record of each
  message template through and drops its repeats for ``interval_s``, then notes how many it
  dropped. The ``gms`` CLI puts it on its stderr handler, so no warning source can flood a
  terminal, whether or not it uses :class:`Outage`.

No library fits both halves: rate-limiting filters (``log-rate-limit``, ``ratelimitingfilter``)
cannot see the success that ends an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

REMIND_S = 300.0  # a long outage is mentioned again this often
REPEAT_INTERVAL_S = 60.0
KEYS_MAX = 1024  # message templates a RepeatFilter remembers


class Outage:
    """One failing activity (``what``, e.g. ``"etcd keep-alive of broker b1"``). Not thread-safe:
    each instance belongs to one task or thread."""

    def __init__(self, logger: logging.Logger, what: str, *, remind_s: float = REMIND_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self.what = what
        self._remind_s = remind_s
        self._clock = clock
        self._since: float | None = None
        self._reminded = 0.0
        self.failures = 0

    @property
    def active(self) -> bool:
        return self._since is not None

    def failed(self, err: object) -> None:
        now = self._clock()
        self.failures += 1
        if self._since is None:
            self._since = self._reminded = now
            self._log.warning("%s failed: %s (repeats are not logged until it recovers)", self.what, err)
        elif now - self._reminded >= self._remind_s:
            self._reminded = now
            self._log.warning("%s still failing after %.0f s (%d failures): %s",
                              self.what, now - self._since, self.failures, err)

    def recovered(self) -> None:
        if self._since is None:
            return
        self._log.info("%s recovered after %.1f s (%d failures)", self.what, self._clock() - self._since,
                       self.failures)
        self._since = None
        self.failures = 0


class RepeatFilter(logging.Filter):
    """Passes the first record of each (logger, message template) per ``interval_s``."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()  # records come from the caller's and the I/O thread
        # (logger name, template) -> (when last passed, records dropped since)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            if len(self._seen) >= KEYS_MAX and key not in self._seen:  # templates built per call
                self._seen.clear()
            passed, dropped = self._seen.get(key, (float("-inf"), 0))
            if now - passed < self._interval_s:
                self._seen[key] = (passed, dropped + 1)
                return False
            self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.msg} [{dropped} like this in the last {now - passed:.0f} s not shown]"
        return True
