"""The key index: files of hash slots and chained entries, rolled when full, rebuilt by
recovery, deleted with retention; lookups through the store check every candidate record."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from store_helpers import small_config

from gms import record as rec
from gms.broker.keyindex import IndexFile, batch_keys, key_hash
from gms.broker.store import MessageStore
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE
from gms.record import Message, encode_batch
from gms.record.batch import parse_batch
from gms.store_errors import UnknownTopic


def keyed(topic: str, first: int, n: int, *, queue_id: int = 0, extra: tuple[str, ...] = ()) -> bytes:
    return encode_batch([Message(topic, b"b-%d" % i, keys=(f"k{i}", *extra), queue_id=queue_id)
                         for i in range(first, first + n)])


def bodies(views: list[memoryview]) -> list[bytes]:
    return [bytes(rec.decode_record(v).body) for v in views]


def open_store(store_dir: Path, **overrides) -> MessageStore:
    return MessageStore(store_dir, small_config(**{"key_index_slots": 16, "key_index_entries_per_file": 40,
                                                   **overrides}))


def test_batch_keys_split_every_key_and_hash_it_with_the_topic():
    buf = encode_batch([Message("a", b"x", keys=("k1", "k2")), Message("a", b"y"), Message("b", b"z", keys=("k1",))])
    parsed = parse_batch(memoryview(buf), 1 << 20)
    keys = batch_keys(np.frombuffer(buf, np.uint8), parsed.starts, parsed.headers, parsed.topics, parsed.topic_index)
    assert keys.records.tolist() == [0, 0, 2]
    assert keys.hashes.tolist() == [key_hash("a", "k1"), key_hash("a", "k2"), key_hash("b", "k1")]
    assert len({key_hash("a", "k1"), key_hash("b", "k1"), key_hash("a", "k10"), key_hash("a", "1k")}) == 4
    with pytest.raises(ValueError):
        key_hash("a", "two words")


def test_vectorised_and_scalar_hashes_agree_on_random_keys():
    rnd = random.Random(16)
    messages, expected = [], []
    for _ in range(400):
        topic = rnd.choice(["a", "bb", "orders-eu"])
        keys = tuple("".join(rnd.choices("ab0é😀-", k=rnd.randint(1, 40))) for _ in range(rnd.randint(0, 3)))
        messages.append(Message(topic, b"x", keys=keys))
        expected += [key_hash(topic, k) for k in keys]
    buf = encode_batch(messages)
    parsed = parse_batch(memoryview(buf), 1 << 20)
    keys = batch_keys(np.frombuffer(buf, np.uint8), parsed.starts, parsed.headers, parsed.topics, parsed.topic_index)
    assert keys.hashes.tolist() == expected


def test_index_file_truncation_keeps_the_chains_of_the_entries_kept(tmp_path):
    f = IndexFile.create(tmp_path, 100, 8, 50)
    try:
        hashes = np.arange(40, dtype=np.int64) * 7919 - 50_000  # negative ones too
        f.add(hashes[:20], np.arange(100, 120, dtype=np.int64), np.full(20, 5, np.int64))
        for i in range(20, 40):
            f.add_one(int(hashes[i]), 100 + i, 6)
        assert [next(f.walk(int(h), 0, 10)) for h in hashes] == list(range(100, 140))
        assert list(f.walk(int(hashes[30]), 0, 5)) == []  # stored at 6
        f.truncate(115)
        assert (f.count, f.end_phys, f.end_ts_ms) == (15, 115, 5)
        assert [list(f.walk(int(h), 0, 10)) for h in hashes[:16]] == [[100 + i] for i in range(15)] + [[]]
    finally:
        f.close()


def test_many_keys_all_found_across_rolled_files(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("t", 2)
        for first in range(0, 300, 30):  # 600 entries (2 keys each): 15 files of 40
            store.append(keyed("t", first, 30, queue_id=first // 30 % 2, extra=("all",)))
        files = sorted((store_dir / "index").iterdir())
        assert len(files) == 15
        for i in (0, 1, 149, 150, 299):
            assert bodies(store.find_by_key("t", f"k{i}")) == [b"b-%d" % i]
        assert bodies(store.find_by_key("t", "all", max_messages=5)) == [b"b-%d" % i for i in range(299, 294, -1)]
        assert len(store.find_by_key("t", "all", max_messages=1000)) == 300
        assert store.find_by_key("t", "k300") == []


def test_slot_collisions_and_other_topics_are_told_apart(store_dir):
    with open_store(store_dir, key_index_slots=1, key_index_entries_per_file=1000) as store:  # one chain
        store.create_topic("t", 1)
        store.create_topic("u", 1)
        store.append(keyed("t", 0, 50))
        store.append(keyed("u", 0, 50))
        assert bodies(store.find_by_key("t", "k7")) == [b"b-7"]
        assert [rec.decode_record(v).topic for v in store.find_by_key("u", "k7")] == ["u"]
        with pytest.raises(UnknownTopic):
            store.find_by_key("nope", "k7")


def test_time_range_picks_records_stored_in_it(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("t", 1)
        store.append(encode_batch([Message("t", b"old", keys=("same",))]))
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        store.append(encode_batch([Message("t", b"new", keys=("same",))]))
        assert bodies(store.find_by_key("t", "same")) == [b"new", b"old"]
        assert bodies(store.find_by_key("t", "same", begin_ms=middle)) == [b"new"]
        assert bodies(store.find_by_key("t", "same", end_ms=middle)) == [b"old"]


def test_single_sends_are_indexed_and_found_after_reopen(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("t", 1)
        for i in range(60):  # 61 entries: single sends roll files too
            store.append(encode_batch([Message("t", b"one-%d" % i, keys=(f"s{i}", "x") if i == 30 else (f"s{i}",))]))
    with open_store(store_dir) as store:
        assert not store.recovered_from_crash
        assert bodies(store.find_by_key("t", "s59")) == [b"one-59"]
        assert bodies(store.find_by_key("t", "s0")) == [b"one-0"]
        assert bodies(store.find_by_key("t", "x")) == [b"one-30"]
        assert len(list((store_dir / "index").iterdir())) == 2


def test_crash_recovery_reindexes_records_after_the_checkpoint(store_dir):
    with open_store(store_dir) as store:
        store.create_topic("t", 1)
        store.append(keyed("t", 0, 10))
    checkpoint = (store_dir / CHECKPOINT_FILE).read_bytes()
    saved = store_dir.parent / "index-at-checkpoint"
    shutil.copytree(store_dir / "index", saved)
    with open_store(store_dir) as store:
        for first in range(10, 100, 10):
            store.append(keyed("t", first, 10))
    # As a crash leaves it: the index as flushed at the checkpoint, the commitlog beyond it.
    shutil.rmtree(store_dir / "index")
    shutil.copytree(saved, store_dir / "index")
    (store_dir / CHECKPOINT_FILE).write_bytes(checkpoint)
    (store_dir / ABORT_FILE).write_bytes(b"")
    with open_store(store_dir) as store:
        assert store.recovered_from_crash
        for i in (0, 9, 10, 55, 99):
            assert bodies(store.find_by_key("t", f"k{i}")) == [b"b-%d" % i]
        store.append(keyed("t", 100, 1))
        assert bodies(store.find_by_key("t", "k100")) == [b"b-100"]


def test_sigkill_then_every_durable_key_is_found(tmp_path):
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "key_crash_writer.py"), str(root)],
                             stdout=subprocess.PIPE, env=env, text=True)
    durable = 0
    deadline = time.monotonic() + 30
    try:
        while durable < 6000 and time.monotonic() < deadline:  # checkpoints (every 300 ms) come and go
            line = child.stdout.readline()
            if not line:
                break
            durable = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert durable >= 200, "the writer did not get going"
    config = small_config(commitlog_file_size_bytes=64 * 1024, key_index_slots=64, key_index_entries_per_file=500)
    with MessageStore(root, config) as store:
        assert store.recovered_from_crash
        for i in range(0, durable, 7):
            assert bodies(store.find_by_key("t", f"order-{i}")) == [b"m-%d" % i]
        found = store.find_by_key("t", "shared", max_messages=1_000_000)
        assert len(found) >= durable and len({bytes(v) for v in found}) == len(found)


def test_retention_deletes_index_files_below_the_commitlog(store_dir):
    with open_store(store_dir, checkpoint_interval_ms=1, retention_hours=1.0) as store:
        store.create_topic("t", 1)
        for first in range(0, 200, 20):
            store.append(keyed("t", first, 20))
            time.sleep(0.03)  # a flush, and with it a checkpoint
        before = sorted(p.name for p in (store_dir / "index").iterdir())
        assert len(before) == 5
        deleted = store.delete_expired(now_ms=int(time.time() * 1000) + 2 * 3_600_000)
        assert deleted > 0
        after = sorted(p.name for p in (store_dir / "index").iterdir())
        assert after and len(after) < len(before) and after == before[-len(after):]
        remaining = IndexFile.open(store_dir / "index" / after[0], int(after[0]))
        try:
            assert remaining.end_phys > store.stats().min_offset
        finally:
            remaining.close()
        assert store.find_by_key("t", "k0") == []


@pytest.mark.parametrize("damage", ["magic", "short", "empty"])
def test_a_damaged_index_file_is_dropped_and_rebuilt_at_open(store_dir, damage, caplog):
    """The index derives from the commitlog: a bad file never stops the store, its keys come back."""
    with open_store(store_dir) as store:
        store.create_topic("t", 1)
        for first in range(0, 100, 10):  # 100 entries: 3 files of 40
            store.append(keyed("t", first, 10))
    files = sorted((store_dir / "index").iterdir())
    assert len(files) == 3
    damaged = files[1]
    raw = bytearray(damaged.read_bytes())
    if damage == "magic":
        raw[0] ^= 0x10
    damaged.write_bytes({"magic": bytes(raw), "short": bytes(raw[:10]), "empty": b""}[damage])
    with open_store(store_dir) as store:
        assert [bodies(store.find_by_key("t", f"k{i}")) for i in range(100)] == [[b"b-%d" % i] for i in range(100)]
        assert len(list((store_dir / "index").iterdir())) == 3
    assert "is not a key index file" in caplog.text
