"""Bit flips at the storage level: recovery keeps damaged records indexed (never a reason to cut
what follows), the serve path answers them as damaged, never as data, while the store runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE
from gms.broker.store_config import StoreConfig
from gms.record import Message, decode_record, encode_batch, scan_records

CONFIG = {"commitlog_file_size_bytes": 1 << 20, "cq_entries_per_file": 1000, "flush_interval_ms": 20,
          "retention_check_interval_ms": 60_000, "checkpoint_interval_ms": 3_600_000, "warm_next_file": False}


def bodies(n: int, start: int = 0) -> bytes:
    return encode_batch([Message("t", b"m-%04d" % i) for i in range(start, start + n)])


def flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ 0x01]))


def record_at(store_dir: Path, queue_offset: int) -> tuple[Path, int, int]:
    path = sorted((store_dir / "commitlog").iterdir())[0]
    data = path.read_bytes()
    for start in scan_records(data, verify_crc=False).starts:
        record = decode_record(data, start, verify_crc=False)
        if record.queue_offset == queue_offset:
            return path, start, record.total_size
    raise AssertionError(f"no record at offset {queue_offset}")


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "store"


def served(store: MessageStore, offset: int = 0, max_msgs: int = 1000) -> list[bytes]:
    got = store.get("t", 0, offset, max_msgs)
    return [bytes(decode_record(view).body) for view in got.records]  # decode_record checks the CRC


def test_damage_while_running_is_answered_as_damaged(store_dir):
    with MessageStore(store_dir, StoreConfig(**CONFIG)) as store:
        store.create_topic("t", 1)
        store.append(bodies(50))
        path, pos, size = record_at(store_dir, 10)
        flip(path, pos + size - 1)  # the store's shared map sees it at once
        got = store.get("t", 0, 0, 1000)
        assert got.damaged == ((10, int(path.name) + pos),)
        assert served(store) == [b"m-%04d" % i for i in range(50) if i != 10]
        alone = store.get("t", 0, 10, 1)  # only the damaged one: an answer without data
        assert (alone.status, alone.next_offset, alone.records) == (GetStatus.FOUND, 11, [])
        assert [d[0] for d in alone.damaged] == [10]
        assert served(store, 11, 5) == [b"m-%04d" % i for i in range(11, 16)]


def test_recovery_keeps_consecutive_damaged_records_and_what_follows(store_dir):
    with MessageStore(store_dir, StoreConfig(**CONFIG)) as store:
        store.create_topic("t", 1)
        store.append(bodies(1))  # the checkpoint of this clean close: recovery scans the rest
    checkpoint = (store_dir / CHECKPOINT_FILE).read_bytes()
    with MessageStore(store_dir, StoreConfig(**CONFIG)) as store:
        store.append(bodies(99, 1))
    (store_dir / CHECKPOINT_FILE).write_bytes(checkpoint)  # as a crash leaves them
    (store_dir / ABORT_FILE).write_bytes(b"")
    for offset in (1, 20, 21, 60):  # 1: where recovery starts
        path, pos, size = record_at(store_dir, offset)
        flip(path, pos + size - 3)
    with MessageStore(store_dir, StoreConfig(**CONFIG)) as store:
        assert store.recovered_from_crash and store.recovered_damaged == 4
        assert store.max_offset("t", 0) == 100
        assert [d[0] for d in store.get("t", 0, 0, 1000).damaged] == [1, 20, 21, 60]
        assert served(store) == [b"m-%04d" % i for i in range(100) if i not in (1, 20, 21, 60)]
        assert store.append(bodies(1, 100)).queue_offsets.tolist() == [100]
