"""Many queues in one store: opening it (cleanly closed or after a crash) reads each queue's
files without mapping their pages: a queue costs resident memory once it is read or written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from store_helpers import batch, mapped_kib, small_config

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.checkpoint import read_checkpoint
from gms.broker.store.durability import CQ_FLUSH_LEAST_ENTRIES
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE

TOPICS = 60
QUEUES = 4
CQ_ENTRIES = 300_000  # the default: 6 MB files, mostly holes, far larger than the kernel's fault-around


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
        queue_dirs = list((store_dir / "consumequeue").glob("*/*"))
        assert {(d.parent.name, int(d.name)) for d in queue_dirs} == set(queues)  # made with their topic
        assert {(d.parent.name, int(d.name)) for d in queue_dirs if any(d.iterdir())} == set(used)


def test_a_checkpoint_syncs_busy_queues_and_stops_at_the_first_unsynced_entry(store_dir):
    """A queue with fewer than CQ_FLUSH_LEAST_ENTRIES new entries is not synced at a checkpoint;
    the checkpoint stops at its first unsynced entry's record, and a crash recovers every record
    once. A thorough checkpoint (as at close) syncs every queue."""
    config = small_config(checkpoint_interval_ms=3_600_000)  # only the checkpoints this test asks for
    busy = CQ_FLUSH_LEAST_ENTRIES + 10
    with MessageStore(store_dir, config) as store:
        store.create_topic("quiet", 1)
        store.create_topic("busy", 1)
        quiet_phys = int(store.append(batch("quiet", n=3)).phys_offsets[0])
        store.append(batch("busy", n=busy))
        end = store.durable_future(store.stats().max_offset).result(timeout=30)
        store._durability.checkpoint_at(end, int(time.time() * 1000))
        checkpoint = read_checkpoint(store_dir / CHECKPOINT_FILE)
        assert checkpoint is not None and checkpoint.cq_safe_offset == quiet_phys < end
        snapshot = (store_dir / CHECKPOINT_FILE).read_bytes()
        store._durability.checkpoint_at(end, int(time.time() * 1000), thorough=True)
        thorough = read_checkpoint(store_dir / CHECKPOINT_FILE)
        assert thorough is not None and thorough.cq_safe_offset == end
    (store_dir / CHECKPOINT_FILE).write_bytes(snapshot)  # as a crash after the first checkpoint leaves it
    (store_dir / ABORT_FILE).write_bytes(b"")
    with MessageStore(store_dir, config) as store:
        assert store.recovered_from_crash
        for topic, count in (("quiet", 3), ("busy", busy)):
            got = store.get(topic, 0, 0, busy + 10)
            assert (got.status, len(got.records), store.max_offset(topic, 0)) == (GetStatus.FOUND, count, count)


def test_a_new_queue_s_directories_are_synced_by_the_checkpoint_not_by_the_append(store_dir, monkeypatch):
    """The first append to a queue makes its first index file on the request loop (its directory
    was made with the topic, on the topic worker); the directory fsync that makes the file's name
    survive a crash (~1 ms: a thousand new queues stalled every send for seconds) waits for the
    checkpoint, which does it before it counts any of the queue's entries as durable."""
    import gms.broker.mapped_file as mapped_file
    import gms.broker.segment_list as segment_list
    import gms.broker.store.durability as store_module

    events: list[tuple[str, Path]] = []

    real_fsync = mapped_file.fsync_dir

    def spy_fsync_dir(directory: Path) -> None:
        events.append(("fsync", directory))
        real_fsync(directory)

    real_write_checkpoint = store_module.write_checkpoint

    def spy_write_checkpoint(path, checkpoint):
        events.append(("checkpoint", path))
        real_write_checkpoint(path, checkpoint)

    config = small_config(cq_entries_per_file=CQ_ENTRIES)
    with MessageStore(store_dir, config) as store:
        store.create_topic("fresh", QUEUES)
        monkeypatch.setattr(segment_list, "fsync_dir", spy_fsync_dir)
        monkeypatch.setattr(mapped_file, "fsync_dir", spy_fsync_dir)
        monkeypatch.setattr(store_module, "write_checkpoint", spy_write_checkpoint)
        store.append(batch("fresh", n=3, queue_id=2))
        queue_dir = next(p for p in store_dir.rglob("2") if p.is_dir() and p.parent.name == "fresh")
        appended = list(events)
    assert not [d for kind, d in appended if kind == "fsync" and "fresh" in str(d)], appended
    synced = [d for kind, d in events if kind == "fsync"]
    assert queue_dir in synced  # the name of the queue's first file (its directory came with the topic)
    first_checkpoint = events.index(next(e for e in events if e[0] == "checkpoint"))
    assert events.index(("fsync", queue_dir)) < first_checkpoint
    with MessageStore(store_dir, config) as store:
        assert store.get("fresh", 2, 0).status is GetStatus.FOUND
