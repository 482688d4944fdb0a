"""Appends are atomic: an error anywhere in an append leaves no trace -- nothing in the commitlog
without its index entries, no queue offset used twice, no batch half indexed -- and both the
next append and a crash recovery afterwards are consistent."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gms import record as rec
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.paths import ABORT_FILE
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch
from gms.store_errors import StoreIOError

CONFIG = {"commitlog_file_size_bytes": 4096, "cq_entries_per_file": 4, "flush_mode": "sync",
          "checkpoint_interval_ms": 3_600_000, "warm_next_file": False}


def open_store(root: Path) -> MessageStore:
    store = MessageStore.open(root, StoreConfig(**CONFIG))
    if "t" not in store.topics():
        store.create_topic("t", 2)
    return store


def batch(*bodies_and_queues: tuple[bytes, int]) -> bytes:
    return encode_batch([Message("t", body, queue_id=queue) for body, queue in bodies_and_queues])


def acked(store: MessageStore, data: bytes) -> None:
    result = store.append(data)
    store.durable_future(result.end_phys_offset).result(5)


def queue_bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    """Every record of the queue, checked to carry its own queue offset."""
    got = store.get("t", queue_id, 0, 100_000)
    if got.status is GetStatus.NO_NEW_MESSAGE:
        return []
    out = []
    for offset, view in enumerate(got.records):
        r = rec.decode_record(view)
        assert (r.queue_id, r.queue_offset) == (queue_id, offset)
        out.append(bytes(r.body))
    return out


def crash_copy(root: Path, dest: Path) -> Path:
    """Copy a running store's files as a process crash leaves them (the mapped pages survive, the
    abort marker is there, the checkpoint is the one of the first flush)."""
    shutil.copytree(root, dest)
    assert (dest / ABORT_FILE).exists()
    return dest


def assert_no_trace(store: MessageStore, committed: int) -> None:
    """Nothing past the committed end of the commitlog: an append that failed left no bytes."""
    commitlog = store._commitlog
    assert commitlog is not None
    assert commitlog.write_pos == commitlog.committed_pos == committed
    f = commitlog.file_for(committed)
    assert not f.array[committed - f.base_offset:].any()
    assert all(not f.array.any() for f in commitlog._spare.values())


def fail_index_file_creation(monkeypatch: pytest.MonkeyPatch, queue_dir: str) -> None:
    real = ConsumeQueue._add_file

    def add_file(cq: ConsumeQueue, offset: int) -> None:
        if cq.directory.name == queue_dir:
            raise StoreIOError(f"cannot create a file in {cq.directory}: [Errno 24] Too many open files")
        real(cq, offset)

    monkeypatch.setattr(ConsumeQueue, "_add_file", add_file)


def test_failed_index_file_creation_stores_nothing(tmp_path, monkeypatch):
    """EMFILE while creating the next consumeQueue file of one queue of a two-queue batch."""
    root = tmp_path / "store"
    store = open_store(root)
    try:
        acked(store, batch((b"a0", 0), (b"b0", 1), (b"b1", 1), (b"b2", 1)))  # one slot left in queue 1's file
        committed = store._commitlog.committed_pos
        fail_index_file_creation(monkeypatch, "1")
        with pytest.raises(StoreIOError, match="Too many open files"):
            store.append(batch((b"lost-a", 0), (b"lost-b", 1), (b"lost-c", 1)))
        assert (store.max_offset("t", 0), store.max_offset("t", 1)) == (1, 3)
        assert_no_trace(store, committed)
        monkeypatch.undo()
        result = store.append(batch((b"a1", 0), (b"b3", 1), (b"b4", 1)))
        assert result.queue_offsets.tolist() == [1, 3, 4]  # fresh offsets, none used twice
        store.durable_future(result.end_phys_offset).result(5)
        expected = [[b"a0", b"a1"], [b"b0", b"b1", b"b2", b"b3", b"b4"]]
        assert [queue_bodies(store, q) for q in (0, 1)] == expected
        crashed = crash_copy(root, tmp_path / "crashed")
    finally:
        store.close()
    with MessageStore(crashed, StoreConfig(**CONFIG)) as recovered:
        assert recovered.recovered_from_crash
        assert [queue_bodies(recovered, q) for q in (0, 1)] == expected
    with MessageStore(root, StoreConfig(**CONFIG)) as reopened:  # and after the clean stop
        assert [queue_bodies(reopened, q) for q in (0, 1)] == expected


def test_error_while_indexing_rolls_the_batch_back(tmp_path, monkeypatch):
    """An error after the records were copied (here: writing the second queue's entries, once
    the first queue's are in) erases the batch: the commitlog bytes, the entries, the file it
    rolled into."""
    root = tmp_path / "store"
    store = open_store(root)
    try:
        acked(store, batch((b"a0", 0), (b"b0", 1)))
        committed = store._commitlog.committed_pos
        files_before = list(store._commitlog.files)
        real_write = ConsumeQueue.write

        def write(cq: ConsumeQueue, start: int, entries: np.ndarray) -> None:
            if cq.directory.name == "1" and entries["size"].any():
                raise MemoryError("injected")
            real_write(cq, start, entries)

        monkeypatch.setattr(ConsumeQueue, "write", write)
        big = b"x" * 1500  # three of them roll the 4 KiB commitlog file
        with pytest.raises(MemoryError):  # queue 0 fills its index file and goes on in the next one
            store.append(batch((big, 0), (big, 0), (big, 1), (b"c", 0), (b"d", 1), (b"e", 0)))
        assert store._commitlog.files == files_before
        assert (store.max_offset("t", 0), store.max_offset("t", 1)) == (1, 1)
        assert_no_trace(store, committed)
        cq0 = store._queues.queue("t", 0)
        assert not cq0.files[0].array[20:].any() and not cq0.files[1].array.any()  # entries erased
        monkeypatch.undo()
        result = store.append(batch((big, 0), (big, 1), (big, 0), (b"f", 1)))
        assert result.queue_offsets.tolist() == [1, 1, 2, 2]
        store.durable_future(result.end_phys_offset).result(5)
        expected = [[b"a0", big, big], [b"b0", big, b"f"]]
        assert [queue_bodies(store, q) for q in (0, 1)] == expected
        crashed = crash_copy(root, tmp_path / "crashed")
    finally:
        store.close()
    with MessageStore(crashed, StoreConfig(**CONFIG)) as recovered:
        assert [queue_bodies(recovered, q) for q in (0, 1)] == expected


def test_error_while_indexing_queues_in_rows_rolls_the_batch_back(tmp_path, monkeypatch):
    """As above, for a batch whose queues' records each come in a row (a producer's send over
    many queues, grouped as slices): queue 0's entries spill into its next index file, then
    writing queue 1's fails; nothing stays, and the next such batch continues each queue."""
    root = tmp_path / "store"
    store = open_store(root)
    try:
        acked(store, batch((b"a0", 0), (b"b0", 1)))
        committed = store._commitlog.committed_pos
        real_write = ConsumeQueue.write_raw  # a queue's entries as a slice of the batch's

        def write_raw(cq: ConsumeQueue, start: int, raw: memoryview) -> None:
            if cq.directory.name == "1" and any(bytes(raw)):
                raise MemoryError("injected")
            real_write(cq, start, raw)

        monkeypatch.setattr(ConsumeQueue, "write_raw", write_raw)
        with pytest.raises(MemoryError):
            store.append(batch((b"c", 0), (b"d", 0), (b"e", 0), (b"f", 0), (b"g", 1), (b"h", 1)))
        assert (store.max_offset("t", 0), store.max_offset("t", 1)) == (1, 1)
        assert_no_trace(store, committed)
        cq0 = store._queues.queue("t", 0)
        assert not cq0.files[0].array[20:].any() and not cq0.files[1].array.any()  # entries erased
        monkeypatch.undo()
        rows = batch((b"i", 1), (b"j", 1), (b"k", 0), (b"l", 0), (b"m", 0), (b"n", 0))  # records of one size
        result = store.append(rows)
        assert result.queue_offsets.tolist() == [1, 2, 1, 2, 3, 4]
        assert result.touched_queues == [("t", 1), ("t", 0)] and result.queue_counts == [2, 4]
        assert result.queue_bytes == [len(rows) // 3, len(rows) // 3 * 2] and result.queue_ends == [3, 5]
        store.durable_future(result.end_phys_offset).result(5)
        expected = [[b"a0", b"k", b"l", b"m", b"n"], [b"b0", b"i", b"j"]]
        assert [queue_bodies(store, q) for q in (0, 1)] == expected
        crashed = crash_copy(root, tmp_path / "crashed")
    finally:
        store.close()
    with MessageStore(crashed, StoreConfig(**CONFIG)) as recovered:
        assert [queue_bodies(recovered, q) for q in (0, 1)] == expected


def test_single_record_append_that_fails_leaves_no_trace(tmp_path, monkeypatch):
    """The single-send path (no numpy) rolls back like a batch: an error after the copy leaves
    neither bytes nor an entry, and the next send gets the same offset."""
    root = tmp_path / "store"
    store = open_store(root)
    try:
        acked(store, batch((b"a0", 0)))
        committed = store._commitlog.committed_pos

        def write_one(cq: ConsumeQueue, *args: int) -> None:
            raise MemoryError("injected")

        monkeypatch.setattr(ConsumeQueue, "write_one", write_one)
        with pytest.raises(MemoryError):
            store.append(batch((b"lost", 0)))
        assert store.max_offset("t", 0) == 1
        assert_no_trace(store, committed)
        monkeypatch.undo()
        result = store.append(batch((b"a1", 0)))
        assert result.queue_offsets.tolist() == [1]
        store.durable_future(result.end_phys_offset).result(5)
        crashed = crash_copy(root, tmp_path / "crashed")
    finally:
        store.close()
    with MessageStore(crashed, StoreConfig(**CONFIG)) as recovered:
        assert queue_bodies(recovered, 0) == [b"a0", b"a1"]


def test_failed_commitlog_file_creation_stores_nothing(tmp_path, monkeypatch):
    root = tmp_path / "store"
    store = open_store(root)
    try:
        acked(store, batch((b"a0", 0)))
        committed = store._commitlog.committed_pos

        def no_file(base: int) -> None:
            raise StoreIOError("cannot create a commitlog file: [Errno 28] No space left on device")

        monkeypatch.setattr(store._commitlog._segments, "create", no_file)
        with pytest.raises(StoreIOError, match="No space"):
            store.append(batch(*[(b"y" * 1500, q % 2) for q in range(3)]))
        assert (store.max_offset("t", 0), store.max_offset("t", 1)) == (1, 0)
        assert_no_trace(store, committed)
        monkeypatch.undo()
        result = store.append(batch((b"a1", 0), (b"b0", 1)))
        assert result.queue_offsets.tolist() == [1, 0]
    finally:
        store.close()


# A store in a child process whose descriptor limit runs out while files are being created: each
# batch goes to three of eight queues whose consumeQueue files hold 4 entries. After three failed
# sends the "operator" raises the limit; the parent kills the child later.
WRITER = r"""
import os, resource, sys
from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch
from gms.store_errors import StoreError

store = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=4,
                                                flush_mode="sync", warm_next_file=False))
store.create_topic("t", 8)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 100, hard))
failures, i = 0, 0
while True:
    bodies = [b"m%d" % (i + k) for k in range(3)]
    try:
        result = store.append(encode_batch([Message("t", b, queue_id=(i + k) % 8) for k, b in enumerate(bodies)]))
        store.durable_future(result.end_phys_offset).result()
    except StoreError as err:
        print("fail", *(b.decode() for b in bodies), "|", err, flush=True)
        failures += 1
        if failures == 3:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    else:
        for b, q, o in zip(bodies, result.queue_ids.tolist(), result.queue_offsets.tolist()):
            print("ok", q, o, b.decode(), flush=True)
    i += 3
"""


def test_descriptor_exhaustion_then_sigkill_keeps_every_acknowledged_message_once(tmp_path):
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    acks: dict[tuple[int, int], str] = {}
    failed: list[str] = []
    lost: list[str] = []
    after_failures = 0
    deadline = time.monotonic() + 60
    try:
        while after_failures < 100 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            kind, *rest = line.split(" ", 1)
            if kind == "fail":
                bodies, message = rest[0].split(" | ", 1)
                failed.append(message)
                lost.extend(bodies.split())
                continue
            queue, offset, body = rest[0].split()
            assert (int(queue), int(offset)) not in acks, f"queue offset {queue}/{offset} acknowledged twice"
            acks[int(queue), int(offset)] = body
            after_failures += len(failed) >= 3
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        errors = child.stderr.read()
        child.stdout.close()
        child.stderr.close()
    assert len(failed) >= 3, f"the descriptor limit was never met: {errors[-2000:]}"
    assert after_failures == 100, f"sends did not resume after the limit was raised: {errors[-2000:]}"
    assert all("RLIMIT_NOFILE" in message for message in failed), failed
    with MessageStore(root, StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=4)) as store:
        assert store.recovered_from_crash
        stored: dict[tuple[int, int], str] = {}
        for queue in range(8):
            got = store.get("t", queue, 0, 100_000)
            for offset, view in enumerate(got.records):
                r = rec.decode_record(view)
                assert (r.queue_id, r.queue_offset) == (queue, offset)
                stored[queue, offset] = bytes(r.body).decode()
    assert {key: stored.get(key) for key in acks} == acks  # every acknowledged message, at its offset
    bodies = list(stored.values())
    assert len(bodies) == len(set(bodies))  # each once
    assert not set(lost) & set(bodies)  # nothing of a failed send was kept
