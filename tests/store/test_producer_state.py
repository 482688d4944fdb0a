"""Idempotent producers in the store: a batch stamped with its producer sequence is stored once,
gaps and stale epochs are refused, and what the store knows of producers survives restarts
(clean, and SIGKILL with recovery) and follows truncation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from unittest.mock import ANY

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import small_config

from gms.broker.store import MessageStore
from gms.broker.store.producer_state import BATCHES_KEPT, DuplicateBatch
from gms.errors import OutOfOrderSequenceError, ProducerFencedError, UnknownProducerIdError
from gms.record import Message, decode_record, encode_batch, iter_records
from gms.record.layout import SEQUENCE_PROPERTY
from gms.record.sequence import (
    KAFKA_SEQUENCE_WRAP,
    RECORD_NUMBERED,
    STAMP_BYTES,
    BatchSequence,
    _props_end,
    read_sequence,
    read_sequences,
    stamp_sequence,
)
from gms.store_errors import InvalidRecord

PID = 77


def batch(first: int, n: int, sequence: int | None, *, epoch: int = 0, pid: int = PID, queue_id: int = 0) -> bytearray:
    body = bytearray(encode_batch([Message("t", b"m-%d" % i, queue_id=queue_id, properties={"p": "v"})
                                   for i in range(first, first + n)]))
    if sequence is not None:
        stamp_sequence(body, BatchSequence(pid, epoch, sequence, n))
    return body


def open_store(store_dir: Path) -> MessageStore:
    store = MessageStore(store_dir, small_config())
    if "t" not in store.topics():
        store.create_topic("t", 2)
    return store


@settings(max_examples=400, deadline=None)
@given(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1),
       st.integers(0, (1 << 32) - 1), st.integers(0, STAMP_BYTES), st.sampled_from(b"0aF.-\x02 g"))
def test_stamps_read_together_are_read_as_one_at_a_time(pid, epoch, sequence, count, at, byte):
    """read_sequences (C, a send of many queues' batches) takes exactly the stamps read_sequence
    takes, with the same values, whatever one byte of the stamp is changed to."""
    body = batch(0, 2, 0)
    _, _, end = _props_end(body, 0)
    value = f"{pid:016x}.{epoch:08x}.{sequence:016x}.{count:08x}".encode()
    body[end - STAMP_BYTES + len(SEQUENCE_PROPERTY) + 1: end - 1] = value
    if at < STAMP_BYTES:
        body[end - STAMP_BYTES + at] = byte
    try:
        alone: BatchSequence | None = read_sequence(body)
    except InvalidRecord:
        alone = None
    together = read_sequences(body, np.array([end], np.int64))
    assert together == (None if alone is None else [alone])
    assert read_sequences(body, np.array([STAMP_BYTES - 1], np.int64)) is None
    assert read_sequences(body, np.array([len(body) + 1], np.int64)) is None


def test_stamp_round_trips_and_is_not_a_message_property():
    body = batch(0, 3, 5, epoch=2)
    assert read_sequence(body) == BatchSequence(PID, 2, 5, 3)
    stamp_sequence(body, BatchSequence(PID, 3, 0, 3))  # restamped in place (a batch moved to another queue)
    assert read_sequence(body) == BatchSequence(PID, 3, 0, 3)
    records = list(iter_records(bytes(body)))  # CRCs hold
    assert [dict(r.properties) for r in records] == [{"p": "v"}] * 3
    assert [bytes(r.body) for r in records] == [b"m-0", b"m-1", b"m-2"]


def test_a_retried_batch_is_answered_with_where_it_is(store_dir):
    with open_store(store_dir) as store:
        first = store.append(batch(0, 3, 0))
        with pytest.raises(DuplicateBatch) as dup:
            store.append(batch(0, 3, 0))
        assert (dup.value.base_offset, dup.value.stored, dup.value.count) == (0, 3, 3)
        again = store.batch_result(("t", 0), 0, 3)
        assert again.phys_offsets.tolist() == first.phys_offsets.tolist()
        assert again.end_phys_offset == first.end_phys_offset
        single = store.append(batch(3, 1, 1))  # a single record goes the struct path
        with pytest.raises(DuplicateBatch):
            store.append(batch(3, 1, 1))
        assert single.queue_offsets.tolist() == [3] and store.max_offset("t", 0) == 4


def test_gaps_and_stale_epochs_are_refused_and_new_epochs_restart_at_zero(store_dir):
    with open_store(store_dir) as store:
        store.append(batch(0, 2, 0))
        with pytest.raises(OutOfOrderSequenceError):
            store.append(batch(2, 2, 2))  # batch 1 is missing
        with pytest.raises(OutOfOrderSequenceError):
            store.append(batch(2, 2, 3, epoch=1))  # a new epoch starts at 0
        store.append(batch(2, 2, 0, epoch=1))
        with pytest.raises(ProducerFencedError):
            store.append(batch(4, 2, 1, epoch=0))  # the old epoch was given up
        store.append(batch(4, 2, 0, pid=PID + 1))  # another producer: its own sequence
        with pytest.raises(UnknownProducerIdError):
            store.append(batch(6, 2, 5, pid=PID + 2))  # an unknown producer starts at 0, not anywhere
        with pytest.raises(UnknownProducerIdError):
            store.append(batch(6, 2, 1, epoch=3, pid=PID + 2))  # whatever its epoch
        store.append(batch(6, 2, 0, epoch=3, pid=PID + 2))
        assert store.max_offset("t", 0) == 8


def test_a_kafka_producer_numbers_records_and_its_sequences_wrap(store_dir):
    kafka = RECORD_NUMBERED  # epoch 0 of a producer numbering records
    with open_store(store_dir) as store:
        store.append(batch(0, 3, 0, epoch=kafka))
        with pytest.raises(OutOfOrderSequenceError):
            store.append(batch(3, 2, 1, epoch=kafka))  # batch-numbered: the next starts at record 3
        with pytest.raises(OutOfOrderSequenceError):
            store.append(batch(1, 2, 1, epoch=kafka))  # inside the batch stored: not a retry of it
        store.append(batch(3, 2, 3, epoch=kafka))
        with pytest.raises(DuplicateBatch) as dup:
            store.append(batch(3, 2, 3, epoch=kafka))
        assert (dup.value.base_offset, dup.value.count) == (3, 2)
        assert store.max_offset("t", 0) == 5
        last = KAFKA_SEQUENCE_WRAP - 2  # a new epoch, numbered up to the wrap and past it
        store.append(batch(5, 1, 0, epoch=kafka + 1))
        assert BatchSequence(PID, kafka + 1, last, 2).following == 0
        assert BatchSequence(PID, 1, last, 2).following == last + 1  # gms's numbering does not wrap


def test_a_producer_forgotten_or_cut_starts_again_at_zero(store_dir):
    """The legitimate unknown producers: its state expired (idle past the expiry), or truncation
    cut every batch it knew. Its next batch, past 0, is refused; the producer numbers the queue
    from 0 under a new epoch, which is stored."""
    with open_store(store_dir) as store:
        store.append(batch(0, 2, 0))
        store.append(batch(2, 2, 1))
        store.truncate_queue("t", 0, 0)  # a follower cut back to a new leader that has none of them
        with pytest.raises(UnknownProducerIdError):
            store.append(batch(0, 2, 2))
        assert store.append(batch(0, 2, 0, epoch=1)).queue_offsets.tolist() == [0, 1]
        assert store.append(batch(2, 2, 1, epoch=1)).queue_offsets.tolist() == [2, 3]


def test_only_the_last_batches_are_kept(store_dir):
    with open_store(store_dir) as store:
        for s in range(BATCHES_KEPT + 2):
            store.append(batch(s, 1, s))
        with pytest.raises(DuplicateBatch):
            store.append(batch(BATCHES_KEPT + 1, 1, BATCHES_KEPT + 1))
        with pytest.raises(ProducerFencedError, match="older than the last"):
            store.append(batch(0, 1, 0))


def test_malformed_stamps_are_refused(store_dir):
    with open_store(store_dir) as store:
        wrong_count = batch(0, 3, 0)
        stamp_sequence(wrong_count, BatchSequence(PID, 0, 0, 2))
        with pytest.raises(InvalidRecord, match="holds 3 records"):
            store.append(wrong_count)
        second = batch(0, 1, None) + batch(1, 1, 0)  # stamped, but not first
        with pytest.raises(InvalidRecord, match="first record"):
            store.append(second)
        unstamped_queue = batch(0, 1, None, queue_id=1)  # beside a stamped batch of another queue
        stamped = batch(0, 2, 0)
        with pytest.raises(InvalidRecord, match="each queue's records in a send are one batch"):
            store.append(stamped + unstamped_queue)
        assert store.max_offset("t", 0) == store.max_offset("t", 1) == 0


def test_state_survives_a_clean_restart_and_truncation_forgets_cut_batches(store_dir):
    with open_store(store_dir) as store:
        store.append(batch(0, 2, 0))
        store.append(batch(2, 2, 1))
    with open_store(store_dir) as store:
        with pytest.raises(DuplicateBatch):
            store.append(batch(2, 2, 1))
        store.truncate_queue("t", 0, 2)  # a replica following a new leader that never had batch 1
        stored = store.append(batch(2, 2, 1))  # stored again, at the same offsets
        assert stored.queue_offsets.tolist() == [2, 3]


def test_a_partly_held_batch_is_reported_with_what_the_queue_holds(store_dir):
    """A replica that fetched the first records of a batch, then came to lead."""
    with open_store(store_dir) as store:
        store.append(batch(0, 4, 0))
        store.truncate_queue("t", 0, 2)
        with pytest.raises(DuplicateBatch) as dup:
            store.append(batch(0, 4, 0))
        assert (dup.value.base_offset, dup.value.stored, dup.value.count) == (0, 2, 4)


WRITER = """
import sys
from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch
from gms.record.sequence import BatchSequence, stamp_sequence

store = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=100,
                                                   checkpoint_interval_ms=200))
if "t" not in store.topics():
    store.create_topic("t", 1)
s = 0
while True:
    body = bytearray(encode_batch([Message("t", b"m-%d-%d" % (s, k)) for k in range(3)]))
    stamp_sequence(body, BatchSequence(9, 0, s, 3))
    store.append(body)
    s += 1
    print(s, flush=True)
"""


def test_sigkill_then_every_stored_batch_is_recognised(tmp_path):
    """Crash recovery rebuilds what the last snapshot misses: every batch the killed writer stored
    (its process died, its page cache did not) is a duplicate afterwards, the next one is accepted."""
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        while int(child.stdout.readline() or 0) < 300:
            assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.3)  # past a checkpoint or two
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    with MessageStore(root, small_config(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=100)) as store:
        assert store.recovered_from_crash
        count = store.max_offset("t", 0)
        assert count % 3 == 0, "a batch is stored whole"
        last = count // 3 - 1
        for s in (last, last - 1):
            body = bytearray(encode_batch([Message("t", b"again")] * 3))
            stamp_sequence(body, BatchSequence(9, 0, s, 3))
            with pytest.raises(DuplicateBatch) as dup:
                store.append(body)
            assert dup.value.base_offset == s * 3
            assert bytes(decode_record(store.read_entry("t", 0, s * 3)).body) == b"m-%d-0" % s
        body = bytearray(encode_batch([Message("t", b"next")] * 3))
        stamp_sequence(body, BatchSequence(9, 0, last + 1, 3))
        assert store.append(body).queue_offsets.tolist() == [count, count + 1, count + 2]


def snapshot(path: Path) -> dict:
    """The snapshot, after its CRC line."""
    return msgpack.unpackb(path.read_bytes().split(b"\n", 1)[1], strict_map_key=False)


def test_an_idle_store_writes_no_snapshot_and_a_partial_one_is_completed(store_dir):
    with open_store(store_dir) as store:
        store.append(batch(0, 2, 0))
        states, path = store.producers, store_dir / "config" / "producers.snapshot"
        states.save(0, int(time.time() * 1000))  # a checkpoint below the batch: it is left for the next
        assert snapshot(path)["queues"] == {}
        states.save(1 << 40, int(time.time() * 1000))
        assert snapshot(path)["queues"] == {"0/t": {PID: [0, ANY, [[0, 2, 0, 0]]]}}
        path.unlink()
        states.save(1 << 40, int(time.time() * 1000))
        assert not path.exists(), "nothing changed: nothing written"


def _flip_a_digit(data: bytes) -> bytes:
    """A bit flip that leaves the snapshot valid msgpack: the last batch's number 1 becomes 3."""
    assert data.count(b"\x94\x01\x02") == 1  # an array of 4: sequence 1, 2 records, ...
    return data.replace(b"\x94\x01\x02", b"\x94\x03\x02")


@pytest.mark.parametrize("damage", [lambda data: data[:len(data) // 2], _flip_a_digit],
                         ids=["truncated", "bit-flipped"])
def test_a_damaged_snapshot_is_rebuilt_from_the_log(store_dir, damage):
    """The state below the checkpoint is only in the snapshot: a damaged one is rebuilt from the
    whole log, never taken as it is nor replaced by an empty state (both answer retries wrongly)."""
    with open_store(store_dir) as store:
        store.append(batch(0, 3, 0))
        store.append(batch(3, 2, 1))
    path = store_dir / "config" / "producers.snapshot"
    path.write_bytes(damage(path.read_bytes()))
    with open_store(store_dir) as store:
        with pytest.raises(DuplicateBatch) as dup:
            store.append(batch(3, 2, 1))
        assert (dup.value.base_offset, dup.value.stored) == (3, 2)
        assert store.append(batch(5, 1, 2)).queue_offsets.tolist() == [5]


def test_a_json_snapshot_of_an_earlier_version_is_read_then_replaced(store_dir):
    """A store written by a version that kept the snapshot as JSON (producers.json) keeps its
    producers' state across the upgrade; the first snapshot after it replaces the JSON one."""
    with open_store(store_dir) as store:
        store.append(batch(0, 3, 0))
        store.append(batch(3, 2, 1))
    path = store_dir / "config" / "producers.snapshot"
    queues = {name: {str(pid): state for pid, state in producers.items()}
              for name, producers in snapshot(path)["queues"].items()}
    data = json.dumps({"v": 2, "end": snapshot(path)["end"], "queues": queues}).encode()
    legacy = path.with_name("producers.json")
    legacy.write_bytes(b"%08x\n%s" % (zlib.crc32(data), data))
    path.unlink()
    with open_store(store_dir) as store:
        with pytest.raises(DuplicateBatch) as dup:
            store.append(batch(3, 2, 1))
        assert (dup.value.base_offset, dup.value.stored) == (3, 2)
        store.append(batch(5, 1, 2))
    assert path.exists() and not legacy.exists()


def test_idle_producers_are_forgotten_by_the_appends(store_dir):
    """Producers idle past the expiry are dropped under the write lock (as appends note batches),
    so a producer coming back after that starts again at 0, and snapshots leave it out."""
    store = MessageStore(store_dir, small_config(producer_state_expiry_ms=200))
    store.create_topic("t", 2)
    with store:
        store.append(batch(0, 1, 0, pid=1))
        store.append(batch(1, 1, 0, pid=2))
        time.sleep(0.3)
        store.append(batch(2, 1, 1, pid=2))  # pid 2 is active again; the sweep drops pid 1
        assert len(store.producers) == 1
        with pytest.raises(UnknownProducerIdError):  # forgotten: it starts again at 0 (a new epoch)
            store.append(batch(3, 1, 9, pid=1))
        store.append(batch(3, 1, 0, epoch=1, pid=1))
        with pytest.raises(OutOfOrderSequenceError):  # known: a gap
            store.append(batch(4, 1, 9, pid=2))
