"""Crash recovery against what a kill or a flipped bit leaves in the commitlog: an append cut off
between copying a record and patching its broker envelope (the envelope lies outside the CRC),
and damage to a record's length, magic or envelope in the middle of the log. Recovery keeps
everything intact, never reuses an offset and never refuses to start."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from gms.broker.store import MessageStore
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE
from gms.broker.store_config import StoreConfig
from gms.record import (
    OFF_PHYS_OFFSET,
    OFF_QUEUE_ID,
    OFF_QUEUE_OFFSET,
    OFF_STORE_TS,
    Message,
    decode_record,
    encode_batch,
    encode_record,
    scan_records,
)
from gms.store_errors import InvalidRecord

CONFIG = {"commitlog_file_size_bytes": 1 << 20, "cq_entries_per_file": 1000, "flush_interval_ms": 20,
          "retention_check_interval_ms": 60_000, "checkpoint_interval_ms": 3_600_000, "warm_next_file": False}


def bodies(n: int, start: int = 0) -> bytes:
    return encode_batch([Message("t", b"m-%04d" % i) for i in range(start, start + n)])


def open_store(store_dir: Path, **overrides: int) -> MessageStore:
    """The store at ``store_dir``, opened by ``with``."""
    return MessageStore(store_dir, StoreConfig(**{**CONFIG, **overrides}))


def crash(store_dir: Path) -> None:
    """What a SIGKILL leaves: the abort marker, and no checkpoint newer than the first one."""
    (store_dir / ABORT_FILE).write_bytes(b"")


def commitlog_file(store_dir: Path, index: int = 0) -> Path:
    return sorted((store_dir / "commitlog").iterdir())[index]


def starts(path: Path) -> list[int]:
    return scan_records(path.read_bytes(), verify_crc=False).starts


def patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def flip(path: Path, pos: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ mask]))


def served(store: MessageStore, offset: int = 0) -> list[tuple[int, bytes]]:
    got = store.get("t", 0, offset, 10_000)
    out = []
    for view in got.records:
        record = decode_record(view)  # checks the CRC
        out.append((record.queue_offset, bytes(record.body)))
    return out


def expected(n: int, skip: tuple[int, ...] = ()) -> list[tuple[int, bytes]]:
    return [(i, b"m-%04d" % i) for i in range(n) if i not in skip]


@pytest.fixture
def store_dir(tmp_path) -> Path:
    """A store holding m-0000..m-0099 in queue t/0, closed cleanly, then made to look crashed
    with no checkpoint: recovery rescans every record."""
    root = tmp_path / "store"
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        store.create_topic("t", 1)
        store.append(bodies(100))
    (root / CHECKPOINT_FILE).unlink()
    crash(root)
    return root


def test_append_killed_before_its_envelope_is_patched_is_cut_and_offsets_continue(store_dir):
    path = commitlog_file(store_dir)
    end = starts(path)[-1] + len(encode_record(topic="t", body=b"m-0099"))
    unfinished = encode_record(topic="t", body=b"never acknowledged")  # the producer's bytes, zero envelope
    patch(path, end, unfinished)
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100 and store.recovered_damaged == 0
        assert store.append(bodies(3, 100)).queue_offsets.tolist() == [100, 101, 102]
    crash(store_dir)
    (store_dir / CHECKPOINT_FILE).unlink()
    with open_store(store_dir) as store:
        assert served(store) == expected(103)


def test_first_append_of_a_store_killed_before_its_envelope_is_patched(tmp_path):
    root = tmp_path / "store"
    with open_store(root) as store:
        store.create_topic("t", 1)
    crash(root)
    patch(commitlog_file(root), 0, bodies(5))  # at offset 0 the zero commitlog offset looks right
    with open_store(root) as store:
        assert store.max_offset("t", 0) == 0
        assert store.append(bodies(2)).queue_offsets.tolist() == [0, 1]


def test_batch_copied_tail_first_then_killed_is_cut(store_dir):
    """memcpy may store a buffer's last bytes before its middle: complete-looking records after a
    hole of zeros, none of them patched."""
    path = commitlog_file(store_dir)
    end = path.stat().st_size - path.read_bytes()[::-1].find(b"m-0099"[::-1])  # just past the last body
    batch = bodies(10, 500)
    tail = len(encode_record(topic="t", body=b"m-0509"))
    patch(path, end + len(batch) - tail, batch[-tail:])
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        assert store.append(bodies(1, 100)).queue_offsets.tolist() == [100]


@pytest.mark.parametrize("field", ["size", "magic"])
def test_damaged_framing_mid_log_is_repaired(store_dir, field):
    path = commitlog_file(store_dir)
    flip(path, starts(path)[40] + (2 if field == "size" else 5), 0x10)
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100 and store.recovered_damaged == 0
        assert served(store) == expected(100)
        assert store.append(bodies(1, 100)).queue_offsets.tolist() == [100]


@pytest.mark.parametrize("field", ["size", "magic"])
def test_damaged_framing_and_body_mid_log_costs_that_record_alone(store_dir, field):
    path = commitlog_file(store_dir)
    positions = starts(path)
    flip(path, positions[40] + (2 if field == "size" else 5), 0x10)
    flip(path, positions[41] - 2)  # and its body
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        assert store.recovered_damaged == 1
        assert [d[0] for d in store.get("t", 0, 0, 1000).damaged] == [40]
        assert served(store) == expected(100, skip=(40,))
        assert store.append(bodies(1, 100)).queue_offsets.tolist() == [100]


def test_zeroed_page_mid_log_loses_only_the_records_on_it(store_dir):
    path = commitlog_file(store_dir)
    positions = starts(path)
    patch(path, positions[30] + 10, bytes(positions[35] - positions[30]))  # records 30..35 hit
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        got = store.get("t", 0, 0, 1000)
        assert [d[0] for d in got.damaged] == [30, 31, 32, 33, 34, 35]
        assert served(store) == expected(100, skip=(30, 31, 32, 33, 34, 35))


def test_zeroed_records_mid_log_from_a_record_boundary(store_dir):
    """Zeros where records were (a lost write of whole records): the scan meets what looks like
    the end of the data, yet records follow within a page's reach."""
    path = commitlog_file(store_dir)
    positions = starts(path)
    patch(path, positions[30], bytes(positions[35] - positions[30]))
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        assert [d[0] for d in store.get("t", 0, 0, 1000).damaged] == [30, 31, 32, 33, 34]
        assert served(store) == expected(100, skip=(30, 31, 32, 33, 34))


@pytest.mark.parametrize(("field", "bit"), [(OFF_PHYS_OFFSET + 7, 0x04), (OFF_PHYS_OFFSET, 0x80),
                                            (OFF_STORE_TS, 0x80), (OFF_QUEUE_OFFSET + 7, 0x02),
                                            (OFF_QUEUE_OFFSET + 2, 0x01)])
def test_flipped_envelope_bit_in_recovery_is_repaired(store_dir, field, bit):
    path = commitlog_file(store_dir)
    flip(path, starts(path)[40] + field, bit)
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        assert served(store) == expected(100)
        assert store.append(bodies(1, 100)).queue_offsets.tolist() == [100]


def test_flipped_queue_id_in_recovery_costs_that_record_alone(store_dir):
    path = commitlog_file(store_dir)
    flip(path, starts(path)[40] + OFF_QUEUE_ID + 3, 0x04)  # to queue 4 of a 1-queue topic
    with open_store(store_dir) as store:
        assert store.max_offset("t", 0) == 100
        assert [d[0] for d in store.get("t", 0, 0, 1000).damaged] == [40]
        assert served(store) == expected(100, skip=(40,))


@pytest.mark.parametrize("field", [2, 5, OFF_QUEUE_OFFSET + 7, OFF_PHYS_OFFSET + 6, OFF_QUEUE_ID + 3])
def test_flipped_header_bit_of_a_checkpointed_record_is_repaired_when_served(tmp_path, field):
    root = tmp_path / "store"
    with open_store(root) as store:
        store.create_topic("t", 1)
        store.append(bodies(100))
    path = commitlog_file(root)
    flip(path, starts(path)[40] + field, 0x01)
    with open_store(root) as store:  # a clean restart: nothing is rescanned
        assert served(store, 30) == expected(100)[30:]


def test_damaged_checkpoint_means_a_full_recovery(tmp_path):
    root = tmp_path / "store"
    with open_store(root) as store:
        store.create_topic("t", 1)
        store.append(bodies(100))
    text = (root / CHECKPOINT_FILE).read_bytes()
    (root / CHECKPOINT_FILE).write_bytes(text.replace(b"1", b"3", 1))
    crash(root)
    with open_store(root) as store:
        assert served(store) == expected(100)


def test_damage_at_the_end_of_a_file_does_not_cut_the_next_file(tmp_path):
    root = tmp_path / "store"
    with open_store(root, commitlog_file_size_bytes=64 << 10) as store:
        store.create_topic("t", 1)
        for i in range(0, 2000, 100):
            store.append(bodies(100, i))
    (root / CHECKPOINT_FILE).unlink()
    crash(root)
    first = commitlog_file(root, 0)
    last = starts(first)[-1]
    patch(first, last, bytes(first.stat().st_size - last))  # the last record and the blank marker
    with open_store(root, commitlog_file_size_bytes=64 << 10) as store:
        assert store.max_offset("t", 0) == 2000
        lost = [d[0] for d in store.get("t", 0, 0, 10_000).damaged]
        assert len(lost) == 1
        assert served(store) == expected(2000, skip=tuple(lost))


def test_producer_cannot_forge_the_broker_envelope(tmp_path):
    with open_store(tmp_path / "store") as store:
        store.create_topic("t", 1)
        forged = bytearray(bodies(1))
        struct.pack_into(">qq", forged, OFF_PHYS_OFFSET, 0, 1_700_000_000_000)
        with pytest.raises(InvalidRecord, match="envelope"):
            store.append(bytes(forged))
        assert store.append(bodies(1)).queue_offsets.tolist() == [0]
