"""Many queues in one store: opening it (cleanly closed or after a crash) reads each queue's
files without mapping their pages: a queue costs resident memory once it is read or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import batch, small_config

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_paths import ABORT_FILE, CHECKPOINT_FILE

TOPICS = 60
QUEUES = 4
CQ_ENTRIES = 300_000  # the default: 6 MB files, mostly holes, far larger than the kernel's fault-around


def mapped_kib(under: Path) -> int:
    """Resident KiB of this process's mappings of files under ``under`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) > 5 and fields[5].startswith(str(under))
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def fill(store: MessageStore, queues: list[tuple[str, int]], start: int = 0) -> None:
    for topic, queue_id in queues:
        store.append(batch(topic, n=3, queue_id=queue_id, start=start))


@pytest.mark.parametrize("crash", [False, True])
def test_opening_a_store_maps_no_queue_pages(store_dir, crash):
    config = small_config(cq_entries_per_file=CQ_ENTRIES, commitlog_file_size_bytes=1 << 20)
    topics = [f"t{i:03d}" for i in range(TOPICS)]
    queues = [(t, q) for t in topics for q in range(QUEUES)]
    used = queues[::3]
    with MessageStore(store_dir, config) as store:
        for topic in topics:
            store.create_topic(topic, QUEUES)
        fill(store, used)
    checkpoint = (store_dir / CHECKPOINT_FILE).read_bytes()
    again = used[::2]
    with MessageStore(store_dir, config) as store:
        fill(store, again, start=3)
    if crash:  # as a crash leaves it: the later appends are re-read from the commitlog
        (store_dir / CHECKPOINT_FILE).write_bytes(checkpoint)
        (store_dir / ABORT_FILE).write_bytes(b"")
    with MessageStore(store_dir, config) as store:
        assert store.recovered_from_crash == crash
        # Recovery cuts back and re-indexes the queues appended after the checkpoint: a page
        # each (4 KiB) is written; the others are not touched. Before queues were opened and cut
        # back through pread, every queue cost its whole file's pages (6 MB), then every queue
        # cut back its allocated stretch (64 KiB).
        assert mapped_kib(store_dir / "consumequeue") <= len(again) * 8 * crash
        for topic, queue_id in queues:
            got = store.get(topic, queue_id, 0, 10)
            expected = 6 if (topic, queue_id) in again else 3 if (topic, queue_id) in used else 0
            assert (got.status, len(got.records)) == ((GetStatus.FOUND, expected) if expected
                                                      else (GetStatus.NO_NEW_MESSAGE, 0))
        assert {(d.parent.name, int(d.name)) for d in (store_dir / "consumequeue").glob("*/*")} == set(used)
