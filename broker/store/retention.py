"""Retention policy: which commitlog files may go.

Queues expire by their topic's retention (the store moves each queue's minimum past the records
stored before ``now - retention_ms``); a commitlog file is shared by every topic, so it goes only
once no queue still starts in it or before it -- or, oldest first, while the store is above its
disk cap, whatever the queues still hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gms.broker.mapped_file import MappedFile


def deletion_rule(keep_from: int, disk_usage_bytes: int,
                  disk_usage_max_bytes: int | None) -> Callable[[MappedFile], bool]:
    """A predicate for ``CommitLog.delete_oldest``: a file goes if it lies wholly below
    ``keep_from`` (the lowest commitlog offset anything still needs), or while the store is
    above its disk cap."""
    usage = [disk_usage_bytes]

    def should_delete(f: MappedFile) -> bool:
        over_cap = disk_usage_max_bytes is not None and usage[0] > disk_usage_max_bytes
        if f.end_offset <= keep_from or over_cap:
            usage[0] -= f.disk_bytes()
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
