"""What the store takes on disk, walked on a thread rather than by the caller.

``du`` of a store walks every file: 50 ms for 1,000 topics of 4 queues here, ten times that for
10,000 queues. BROKER_STATUS (which the console asks every few seconds) and the metrics ask for
it; walked on the request loop, each answer stalled every client of the broker that long. The
walk is GNU ``du``'s, a process of its own: walked in Python on a thread, it still held the
interpreter lock for 0.14 s of every walk of 1,000 topics (9,000 files) that the request loop
waited for; ``du`` takes half that CPU and none of the lock. Without GNU du, Python walks.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from gms.broker.mapped_file import tree_disk_bytes

# How old the figure may be before an ask starts a new walk (it answers the last one meanwhile).
DISK_USAGE_MAX_AGE_S = 10.0
DU_TIMEOUT_S = 60.0


def du_bytes(root: Path) -> int:
    """``du -s -B1 root``: the blocks allocated under ``root``, in bytes (a walk in Python,
    :func:`tree_disk_bytes`, where GNU du cannot run or answers nothing)."""
    try:
        done = subprocess.run(["du", "-s", "-B1", "--", str(root)], capture_output=True, text=True,
                              timeout=DU_TIMEOUT_S, check=False)
        return int(done.stdout.split()[0])  # a file gone while du walked is an exit code 1, not a wrong total
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return tree_disk_bytes(root)


class DiskUsage:
    """``bytes()``: what ``root`` takes on disk, walked once when first asked, then again on a
    thread when asked more than ``max_age_s`` after the last walk (the last figure answers meanwhile)."""

    def __init__(self, root: Path, max_age_s: float = DISK_USAGE_MAX_AGE_S) -> None:
        self._root = root
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._bytes: int | None = None
        self._walked_at = 0.0
        self._walking = False

    def bytes(self) -> int:
        with self._lock:
            known, stale = self._bytes, time.monotonic() - self._walked_at >= self._max_age_s
            start = known is not None and stale and not self._walking
            self._walking = self._walking or start
        if known is None:
            self._walk()
            return self._bytes or 0
        if start:
            threading.Thread(target=self._walk, name="gms-disk-usage", daemon=True).start()
        return known

    def _walk(self) -> None:
        found = None
        try:
            found = du_bytes(self._root)
        finally:
            with self._lock:
                self._walking = False
                if found is not None:
                    self._bytes, self._walked_at = found, time.monotonic()
