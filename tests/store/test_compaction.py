"""Compacted topics in the store: the latest record per key survives at its original offset,
tombstones go after their retention, the commitlog files below the compaction point go, reads
(get, get_many, by time) serve the compacted log, and a crash at any step of a compaction loses
nothing (docs/storage-format.md "Compacted topics")."""

import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from compaction_helpers import (
    KEYS,
    TOPIC,
    compaction_workers,
    is_tombstone,
    keyed_batch,
    latest_per_key,
    read_all,
    running,
)
from store_helpers import small_config

from gms.broker.clean_worker import WORKER_MAIN
from gms.broker.store import GetStatus, MessageStore, QueueGet
from gms.broker.store.topic_table import TopicLimits
from gms.errors import InvalidTopicError
from gms.record import OFF_QUEUE_OFFSET, decode_record, iter_records
from gms.store_errors import MessageNotFound

COMPACT = TopicLimits(cleanup_policy="compact", segment_roll_messages=10, dirty_ratio=0.0)
DAY_MS = 86_400_000


def open_store(root: Path) -> MessageStore:
    # checkpoints at every flush: retention never deletes at or past the last checkpoint
    return MessageStore(root, small_config(checkpoint_interval_ms=1, compaction_check_interval_ms=3_600_000))


def fill(store: MessageStore, first: int, n: int) -> int:
    end = store.append(keyed_batch(first, n)).end_phys_offset
    store.durable_future(end).result(5)
    return first + n


def expected_latest(end: int) -> dict[str, tuple[int, bool]]:
    return {f"k{seq % KEYS}": (seq, is_tombstone(seq)) for seq in range(end)}


def test_the_latest_record_of_each_key_survives_at_its_offset(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        end = fill(store, 0, 205)
        assert store.compact() == 1
        found = read_all(store)
        assert latest_per_key(found) == expected_latest(end)
        offsets = [offset for offset, *_ in found]
        below = [o for o in offsets if o < 200]  # the point: a multiple of segment_roll_messages
        assert len(below) == KEYS and offsets[len(below):] == list(range(200, 205))
        assert all(seq == offset for offset, _, seq, _ in found)  # original offsets
        assert store.min_offset(TOPIC, 0) == below[0] == 200 - KEYS
        # a read at a removed offset answers the next kept one; below the first, the minimum
        got = store.get(TOPIC, 0, below[0] + 1, 1)
        assert got.status is GetStatus.FOUND and got.offsets.tolist() == [below[1]] and got.min_offset == below[0]
        assert got.next_offset == below[2]
        got = store.get(TOPIC, 0, 0, 1)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_offset == below[0]
        got = store.get(TOPIC, 0, below[-1] + 1, 10)
        assert got.offsets.tolist() == [200, 201, 202, 203, 204]
        # get_many serves the compacted log too, and the commitlog's records after it
        many = store.get_many([QueueGet(TOPIC, 0, below[0])], max_msgs=100)
        assert [r.queue_offset for view in many[0].records for r in iter_records(view)] == below
        assert many[0].next_offset == 200
        assert store.offset_for_timestamp(TOPIC, 0, 0) == below[0]
    with open_store(store_dir) as store:  # and after a restart
        assert read_all(store) == found


def test_compaction_frees_the_commitlog_files_below_its_point(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 400)
        store.delete_expired()
        first_file = store.stats().min_offset
        store.compact()
        fill(store, 400, 1)  # a checkpoint past the files
        store.delete_expired()
        assert store.stats().min_offset > first_file
        assert latest_per_key(read_all(store)) == expected_latest(401)
        assert all(not name.endswith(".tmp") for name in os.listdir(store_dir / "compacted" / TOPIC / "0"))


def test_repeated_passes_and_tombstones_expire_after_their_retention(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        end = 0
        for _ in range(5):  # keys overwritten many times, compacted again and again
            end = fill(store, end, 100)
            store.compact()
            assert latest_per_key(read_all(store)) == expected_latest(end)
        tombstoned = {key for key, (_, tomb) in expected_latest(end).items() if tomb}
        assert tombstoned
        end = fill(store, end, 10)
        store.compact(now_ms=int(time.time() * 1000) + 2 * DAY_MS)  # past the tombstone retention (1 day)
        latest = latest_per_key(read_all(store))
        for key, (seq, tomb) in expected_latest(end).items():
            if tomb and seq < end // 10 * 10:
                assert key not in latest  # gone with every older value: never resurrected
            else:
                assert latest[key] == (seq, tomb)


def test_the_dirty_ratio_and_the_lag_hold_compaction_back(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, TopicLimits(cleanup_policy="compact", segment_roll_messages=10,
                                                 min_compaction_lag_ms=DAY_MS))
        fill(store, 0, 100)
        assert store.compact() == 0  # everything stored less than a day ago
        store.update_topic(TOPIC, limits=TopicLimits(cleanup_policy="compact", segment_roll_messages=10,
                                                     dirty_ratio=0.9))
        assert store.compact() == 1  # nothing compacted yet: all dirty
        fill(store, 100, 10)
        assert store.compact() == 0  # 10 new records beside 13 compacted: below 0.9
        assert latest_per_key(read_all(store)) == expected_latest(110)


def test_a_delete_topic_is_never_compacted_and_settings_are_checked(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1)
        fill(store, 0, 100)
        assert store.compact() == 0
        assert len(read_all(store)) == 100
    for bad in ({"cleanup_policy": "shrink"}, {"dirty_ratio": 1.5}, {"min_compaction_lag_ms": -1},
                {"segment_roll_messages": 0}, {"tombstone_retention_ms": "x"}):
        with pytest.raises(InvalidTopicError, match=next(iter(bad))):
            TopicLimits(**bad)


def test_a_deleted_topic_takes_its_compacted_log_with_it(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 100)
        store.compact()
        store.delete_topic(TOPIC)
        assert not (store_dir / "compacted" / TOPIC).exists()
        store.create_topic(TOPIC, 1, COMPACT)
        assert read_all(store) == []


def test_what_an_interrupted_compaction_leaves_is_resolved_on_open(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 100)
        store.compact()
        found = read_all(store)
    qdir = store_dir / "compacted" / TOPIC / "0"
    (newest,) = os.listdir(qdir)
    (qdir / f"{0:020d}.seg").write_bytes((qdir / newest).read_bytes()[:50])  # an older one, not yet removed
    (qdir / f"{200:020d}.tmp").write_bytes(b"torn")  # a rewrite cut short
    with open_store(store_dir) as store:
        assert read_all(store) == found
    assert os.listdir(qdir) == [newest]


def test_a_copied_compacted_log_is_installed_whole_or_not_at_all(tmp_path):
    """A follower's copy of its leader's compacted log: a copy cut short (a crash) is removed when
    the store opens; a whole one, installed, serves what the leader's serves, the queue restarted
    at the point."""
    with open_store(tmp_path / "leader") as leader:
        leader.create_topic(TOPIC, 1, COMPACT)
        fill(leader, 0, 205)
        leader.compact()
        on_leader = [r for r in read_all(leader) if r[0] < 200]
        segment = leader.compacted_segment(TOPIC, 0)
        assert segment is not None and segment.point == 200
        data = bytes(segment.view)
    with open_store(tmp_path / "follower") as follower:
        follower.create_topic(TOPIC, 1, COMPACT)
        follower.copy_tmp(TOPIC, 0, 200).write_bytes(data[:100])  # a crash in the middle of the copy
    qdir = tmp_path / "follower" / "compacted" / TOPIC / "0"
    with open_store(tmp_path / "follower") as follower:
        assert os.listdir(qdir) == [] and follower.min_offset(TOPIC, 0) == follower.max_offset(TOPIC, 0) == 0
        tmp = follower.copy_tmp(TOPIC, 0, 200)
        tmp.write_bytes(data)
        assert follower.install_copy(TOPIC, 0, 200, tmp, 200)
        assert read_all(follower) == on_leader and follower.max_offset(TOPIC, 0) == 200
        older = follower.copy_tmp(TOPIC, 0, 100)  # a copy of a lower point than the queue's log: refused
        older.write_bytes(data)
        assert not follower.install_copy(TOPIC, 0, 100, older, 100) and not older.exists()
    with open_store(tmp_path / "follower") as follower:
        assert read_all(follower) == on_leader and os.listdir(qdir) == [f"{200:020d}.seg"]


@pytest.mark.slow
def test_sigkill_at_random_points_of_compaction_loses_no_latest_value(tmp_path):
    """The writer compacts every 50 records at a low IO rate; the kill comes at a random moment of
    the first, second or third compaction of each round (or of the retention run or append after
    it); whatever it interrupts, every key still serves its latest acknowledged record (or a
    later one), and no compaction worker outlives the writer."""
    root = tmp_path / "store"
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here)}
    rng = random.Random()
    acked = 0
    took: list[float] = []  # how long the compactions seen took
    for round_ in range(10):
        child = subprocess.Popen([sys.executable, str(here / "compaction_crash_writer.py"), str(root)],
                                 stdout=subprocess.PIPE, env=env, text=True)
        try:
            word, seq = child.stdout.readline().split()
            assert word == "start" and int(seq) >= acked
            lines, wanted, began = [], rng.randrange(1, 4), 0.0  # the kill comes in the wanted-th compaction
            while sum(line.startswith("compacting") for line in lines) < wanted:
                lines.append(child.stdout.readline())
                assert lines[-1], "the writer stopped"
                if lines[-1].startswith("compacting"):
                    began = time.monotonic()
                elif lines[-1].startswith("compacted"):
                    took.append(time.monotonic() - began)
            # anywhere in it (its worker's start, ~6 KB read and written at 50 KB/s, the install) or just after
            time.sleep(rng.uniform(0, 1.2 * (statistics.median(took) if took else 0.5)))
            workers = compaction_workers(child.pid)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        deadline = time.monotonic() + 30
        while any(running(pid) for pid in workers):  # a worker dies with its broker
            assert time.monotonic() < deadline, f"round {round_}: compaction worker(s) {workers} outlived the writer"
            time.sleep(0.05)
        lines += child.stdout.read().split("\n")
        child.stdout.close()
        acked = max([acked, *(int(line.split()[1]) for line in lines if line.startswith("acked"))])
        assert acked > 0, f"round {round_}: the writer did not get going"
        with MessageStore(root, small_config(commitlog_file_size_bytes=16 * 1024)) as store:
            latest = latest_per_key(read_all(store))
            for key, (seq, _) in expected_latest(acked).items():
                found_seq, found_tomb = latest[key]  # tombstones stay (1 day): every key is there
                assert found_seq >= seq, f"round {round_}, {key}: {found_seq} served, {seq} acknowledged"
                assert found_tomb == is_tombstone(found_seq)


def test_a_bit_flipped_in_a_compacted_log_is_answered_as_damaged(store_dir):
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 100)
        store.compact()
        kept = [offset for offset, *_ in read_all(store)]
        (segment,) = (store_dir / "compacted" / TOPIC / "0").iterdir()
        with open(segment, "r+b") as fh:  # the last byte of the first record's body, under the reader's map
            first_size = int.from_bytes(fh.read(4), "big")
            fh.seek(first_size - 1)
            last = fh.read(1)
            fh.seek(first_size - 1)
            fh.write(bytes([last[0] ^ 0x01]))
        got = store.get(TOPIC, 0, kept[0], 100)
        assert got.status is GetStatus.FOUND and [d[0] for d in got.damaged] == [kept[0]]
        assert got.offsets.tolist() == kept[1:]


def test_a_compaction_worker_killed_midway_changes_nothing(store_dir):
    """The cleaner's worker process killed while it writes: the pass is skipped, its tmp file
    removed, the queue served as before; the next pass compacts."""
    config = small_config(checkpoint_interval_ms=1, compaction_check_interval_ms=3_600_000,
                          compaction_io_bytes_per_s=10_000)  # ~40 KB to read and write: seconds
    with MessageStore(store_dir, config) as store, ThreadPoolExecutor(1) as pool:
        store.create_topic(TOPIC, 1, COMPACT)
        end = fill(store, 0, 400)
        before = read_all(store)
        qdir = store_dir / "compacted" / TOPIC / "0"
        passed = pool.submit(store.compact)
        while not (workers := compaction_workers(os.getpid())) or not qdir.is_dir() or not os.listdir(qdir):
            assert not passed.done(), "the pass ended before its worker was seen writing"
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGKILL)
        assert passed.result(60) == 0
        assert read_all(store) == before and os.listdir(qdir) == []
        assert store.min_offset(TOPIC, 0) == 0
        assert store.compact() == 1
        assert latest_per_key(read_all(store)) == expected_latest(end)
        assert [name.endswith(".seg") for name in os.listdir(qdir)] == [True]


def test_the_compaction_worker_runs_at_idle_priority_before_its_imports():
    """The worker's command (what the cleaner starts) lowers its priority before it imports numpy
    and the record modules: that start-up, a seventh of a second of CPU, must not compete with
    the broker's request loop at the broker's own priority."""
    watch = ("import os, sys\n"
             "def hook(event, args):\n"
             "    if event == 'import' and args[0] == 'numpy':\n"
             "        sys.stderr.write(f'numpy imported at policy {os.sched_getscheduler(0)}\\n')\n"
             "sys.addaudithook(hook)\n")
    done = subprocess.run([sys.executable, "-P", "-c", watch + WORKER_MAIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, check=True)
    assert f"numpy imported at policy {os.SCHED_IDLE}\n" in done.stderr, done.stderr


@pytest.mark.parametrize("damage", ["body", "length", "magic", "queue_offset", "tail"])
def test_damage_found_at_open_in_a_compacted_log_is_never_served(store_dir, damage, caplog):
    """A bit flipped on disk in a kept record (its body, its length, its magic or its queue
    offset, which lie outside the CRC) or a torn tail: opening the store serves every other kept
    record and never the damaged one; the next compaction rewrites the log without it."""
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 100)
        store.compact()
        kept = read_all(store)
    (path,) = (store_dir / "compacted" / TOPIC / "0").iterdir()
    data = bytearray(path.read_bytes())
    starts = [0]
    while (end := starts[-1] + int.from_bytes(data[starts[-1]:starts[-1] + 4], "big")) < len(data):
        starts.append(end)
    victim = 5  # the sixth kept record
    at = starts[victim]
    lost = {victim}
    if damage == "body":
        data[starts[victim + 1] - 1] ^= 0x01
    elif damage == "length":
        data[at + 2] ^= 0x10  # 4 KiB more: past the next record's start
    elif damage == "magic":
        data[at + 5] ^= 0x01
    elif damage == "queue_offset":
        data[at + OFF_QUEUE_OFFSET + 7] ^= 0x80  # +128: past the point, it and its successor are out of order
        lost.add(victim + 1)
    else:
        del data[starts[-1] + 10:]
        lost = {len(starts) - 1}
    path.write_bytes(bytes(data))
    served = [record for i, record in enumerate(kept) if i not in lost]
    with open_store(store_dir) as store:
        assert read_all(store) == served  # read_all checks that no answer holds a damaged record
        got = store.get(TOPIC, 0, kept[min(lost)][0], 1)  # a read there answers the next one served
        assert got.offsets is None or got.offsets.tolist() != [kept[min(lost)][0]]
        fill(store, 100, 10)
        assert store.compact() == 1
        newer = [(seq, f"k{seq % KEYS}", seq, is_tombstone(seq)) for seq in range(100, 110)]
        rewritten = read_all(store)
        assert latest_per_key(rewritten) == latest_per_key(served + newer)
    caplog.clear()
    with caplog.at_level(logging.ERROR), open_store(store_dir) as store:  # the rewritten log has no damage left
        assert read_all(store) == rewritten
    assert not caplog.records


def test_lookups_by_key_and_id_answer_kept_records_below_the_point_never_damaged_ones(store_dir):
    """Once commitlog files below the point are gone: a lookup by key answers each key's kept
    record, by position (message id) the kept record stored there and no removed one; a kept
    record whose bit flipped since is answered by neither."""
    with open_store(store_dir) as store:
        store.create_topic(TOPIC, 1, COMPACT)
        fill(store, 0, 400)
        phys = {}  # queue offset -> where it was stored (its message id's position)
        got = store.get(TOPIC, 0, 0, 400, 1 << 20)
        for view in got.records:
            phys[decode_record(view).queue_offset] = decode_record(view).phys_offset
        store.compact()
        fill(store, 400, 1)  # a checkpoint past the files
        store.delete_expired()
        kept = {offset: key for offset, key, _, _ in read_all(store) if offset < 400}
        gone = store.stats().min_offset
        assert phys[min(kept)] < gone  # the commitlog file of the first kept record is gone
        for offset, key in kept.items():
            assert [decode_record(v).queue_offset for v in store.find_by_key(TOPIC, key)] == [
                o for o in (400, offset) if o == offset or f"k{o % KEYS}" == key]
            assert decode_record(store.read_at(phys[offset])).queue_offset == offset
        removed = min(set(range(400)) - set(kept))
        assert phys[removed] < gone
        with pytest.raises(MessageNotFound):
            store.read_at(phys[removed])
        (path,) = (store_dir / "compacted" / TOPIC / "0").iterdir()
        first, key = min(kept), kept[min(kept)]
        with open(path, "r+b") as fh:  # the last byte of the first kept record, under the store's map
            size = int.from_bytes(fh.read(4), "big")
            fh.seek(size - 1)
            last = fh.read(1)
            fh.seek(size - 1)
            fh.write(bytes([last[0] ^ 0x01]))
        assert first not in [decode_record(v, verify_crc=False).queue_offset for v in store.find_by_key(TOPIC, key)]
        with pytest.raises(MessageNotFound):
            store.read_at(phys[first])
