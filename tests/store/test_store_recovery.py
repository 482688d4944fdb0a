import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_helpers import batch, small_config

from gms import record as rec
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE


def all_bodies(store, topic="t", queue_id=0):
    got = store.get(topic, queue_id, store.min_offset(topic, queue_id), 100_000)
    out = []
    for view in got.records:
        r = rec.decode_record(view)  # verifies the CRC: no torn record is served
        out.append(bytes(r.body))
    return out


def simulate_crash(store_dir: Path, n_batches: int = 8) -> list[bytes]:
    """Write, then leave the store as a crash would: abort marker present, stale checkpoint."""
    with MessageStore(store_dir, small_config()) as store:
        store.create_topic("t", 1)
        store.append(batch(n=5))
    checkpoint = (store_dir / CHECKPOINT_FILE).read_bytes()
    with MessageStore(store_dir, small_config()) as store:
        for i in range(n_batches):
            store.append(batch(n=10, start=5 + 10 * i))
        expected = all_bodies(store)
    (store_dir / CHECKPOINT_FILE).write_bytes(checkpoint)
    (store_dir / ABORT_FILE).write_bytes(b"")
    return expected


def test_crash_without_damage_rebuilds_index(store_dir):
    expected = simulate_crash(store_dir)
    for f in (store_dir / "consumequeue" / "t" / "0").iterdir():
        f.unlink()  # lose the whole index: it is rebuilt from the commitlog
    with MessageStore(store_dir, small_config()) as store:
        assert store.recovered_from_crash
        assert all_bodies(store) == expected
        assert store.append(batch(n=1)).queue_offsets.tolist() == [len(expected)]


def last_record(store_dir: Path) -> tuple[Path, int, int]:
    """(file, position, size) of the last record of the commitlog."""
    files = sorted((store_dir / "commitlog").iterdir())
    for path in reversed(files):
        data = path.read_bytes()
        scan = rec.scan_records(data, 0, len(data))
        if len(scan.starts):
            pos = int(scan.starts[-1])
            return path, pos, rec.check_record(data, pos)[1]
    raise AssertionError("no records")


@pytest.mark.parametrize("damage", ["flip_body", "flip_header", "zero_tail", "torn"])
def test_damaged_tail_is_truncated(store_dir, damage):
    expected = simulate_crash(store_dir)
    path, pos, size = last_record(store_dir)
    with open(path, "r+b") as fh:
        if damage == "flip_body":
            fh.seek(pos + size - 1)
            byte = fh.read(1)
            fh.seek(pos + size - 1)
            fh.write(bytes([byte[0] ^ 0xFF]))
        elif damage == "flip_header":
            fh.seek(pos + 1)
            fh.write(b"\x7f")
        elif damage == "zero_tail":
            fh.seek(pos + size // 2)
            fh.write(bytes(size - size // 2))
        elif damage == "torn":  # only the first half of the record reached the disk
            fh.seek(pos + 40)
            fh.write(bytes(size - 40))
    with MessageStore(store_dir, small_config()) as store:
        assert store.recovered_from_crash
        assert all_bodies(store) == expected[:-1]
        assert store.max_offset("t", 0) == len(expected) - 1
        result = store.append(batch(n=1, start=1000))  # new records land right after the good ones
        assert result.queue_offsets.tolist() == [len(expected) - 1]
        assert all_bodies(store)[-1] == b"body-1000"
        with open(path, "rb") as fh:
            data = fh.read()
        end = (result.phys_offsets[0] - int(path.name)) if int(path.name) <= result.phys_offsets[0] else pos
        assert end == pos or result.phys_offsets[0] >= int(path.name) + len(data)
    with MessageStore(store_dir, small_config()) as store:  # and it all survives a clean restart
        assert not store.recovered_from_crash
        assert all_bodies(store)[-1] == b"body-1000"


def test_damage_in_the_middle_costs_that_record_alone(store_dir):
    expected = simulate_crash(store_dir, n_batches=12)
    files = sorted((store_dir / "commitlog").iterdir())
    assert len(files) >= 3
    victim = files[1]
    data = victim.read_bytes()
    scan = rec.scan_records(data, 0, len(data))
    cut = scan.starts[2]
    with open(victim, "r+b") as fh:
        fh.seek(cut + 50)  # inside the CRC-covered fields: the framing stays intact
        fh.write(b"\xff\xff")
    with MessageStore(store_dir, small_config()) as store:
        assert store.recovered_damaged == 1
        assert store.max_offset("t", 0) == len(expected)  # nothing after it was cut
        got = store.get("t", 0, 0, 100_000)
        assert [bytes(rec.decode_record(v).body) for v in got.records] == [
            b for b in expected if b not in {bytes(rec.decode_record(data, cut, verify_crc=False).body)}]
        assert [phys for _, phys in got.damaged] == [int(victim.name) + cut]
        assert store.append(batch(n=1, start=1000)).queue_offsets.tolist() == [len(expected)]


def test_sigkill_during_sync_appends(tmp_path):
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    child = subprocess.Popen([sys.executable, str(Path(__file__).parent / "store_crash_writer.py"), str(root)],
                             stdout=subprocess.PIPE, env=env, text=True)
    durable = []
    deadline = time.monotonic() + 30
    try:
        while len(durable) < 300 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            durable.append(tuple(map(int, line.split())))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert len(durable) >= 50, "the writer did not get going"
    acked_msgs = durable[-1][0]
    with MessageStore(root, small_config(commitlog_file_size_bytes=64 * 1024)) as store:
        assert store.recovered_from_crash
        assert store._commitlog.committed_pos >= durable[-1][1]
        for q in (0, 1):
            got = store.get("t", q, 0, 100_000)
            assert got.status is GetStatus.FOUND
            seen = []
            for view in got.records:
                r = rec.decode_record(view)  # CRC verified: nothing torn is served
                assert r.queue_id == q and r.queue_offset == len(seen)
                assert r.tag == ("even" if q == 0 else "odd")
                seen.append(int(bytes(r.body)[4:12]))
            assert seen == list(range(q, len(seen) * 2 + q, 2))[: len(seen)]
            acked_here = [i for i in range(acked_msgs) if i % 2 == q]
            assert seen[: len(acked_here)] == acked_here  # every acknowledged message is there
