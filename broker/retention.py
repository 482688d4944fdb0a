"""Retention policy: which commitlog files may go (by age, then by a disk-usage cap)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from gms.broker.mapped_file import MappedFile


def expiry_rule(now_ms: int, retention_ms: int, disk_usage_bytes: int,
                disk_usage_max_bytes: int | None) -> Callable[[MappedFile], bool]:
    """A predicate for ``CommitLog.delete_oldest``: a file goes if its last write is older than the
    retention time, or while the store is above its disk cap (oldest first)."""
    usage = [disk_usage_bytes]

    def should_delete(f: MappedFile) -> bool:
        last_write_ms = os.stat(f.path).st_mtime_ns // 1_000_000
        over_cap = disk_usage_max_bytes is not None and usage[0] > disk_usage_max_bytes
        if last_write_ms < now_ms - retention_ms or over_cap:
            usage[0] -= f.size_bytes
            return True
        return False

    return should_delete


class Housekeeper:
    """Runs ``task`` every ``interval_ms`` on a daemon thread until stopped."""

    def __init__(self, task: Callable[[], object], interval_ms: int) -> None:
        self._task = task
        self._interval_s = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gms-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._task()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
