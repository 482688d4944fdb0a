"""A replica's truncation survives crash recovery: rebuilding the consumeQueue from the
commitlog does not resurrect truncated records."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zlib

import pytest

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, decode_record, encode_batch
from gms.store_errors import CorruptRecord, StoreError

CONFIG = {"commitlog_file_size_bytes": 1 << 20, "cq_entries_per_file": 64}


def batch(topic: str, queue_id: int, bodies: list[str], first_offset: int | None = None) -> bytes:
    return encode_batch([Message(topic=topic, body=b.encode(), queue_id=queue_id) for b in bodies])


def bodies(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, str]]:
    result = store.get(topic, queue_id, 0, 1000)
    if result.status is not GetStatus.FOUND:
        return []
    return [(r.queue_offset, bytes(r.body).decode()) for r in map(decode_record, map(bytes, result.records))]


CRASHING_WRITER = textwrap.dedent("""
    import os, sys
    from gms.broker.store import MessageStore
    from gms.broker.store_config import StoreConfig
    from gms.record import Message, encode_batch
    root, config = sys.argv[1], StoreConfig(**eval(sys.argv[2]))
    store = MessageStore.open(root, config)
    store.create_topic("t", 2)
    rec = lambda q, names: encode_batch([Message(topic="t", body=n.encode(), queue_id=q) for n in names])
    store.append(rec(0, ["a0", "a1", "a2", "a3", "a4"]))
    store.append(rec(1, ["b0", "b1"]))
    store.truncate_queue("t", 0, 2)        # a2..a4 diverged from the new leader
    store.append(rec(0, ["c2", "c3"]))     # what the new leader has at offsets 2, 3
    store.append(rec(1, ["b2"]))
    os._exit(9)                            # crash: no checkpoint, abort marker left behind
""")


@pytest.mark.parametrize("lose_checkpoint", [False, True])
def test_truncated_records_stay_gone_after_a_crash(tmp_path, lose_checkpoint):
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-P", "-c", CRASHING_WRITER, str(root), repr(CONFIG)],
                          capture_output=True, check=False)
    assert proc.returncode == 9, proc.stderr.decode()
    if lose_checkpoint:  # force a rebuild from the start of the commitlog
        (root / "checkpoint").unlink(missing_ok=True)
        for f in (root / "consumequeue").rglob("*"):
            if f.is_file():
                f.unlink()
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        assert store.recovered_from_crash
        assert bodies(store, "t", 0) == [(0, "a0"), (1, "a1"), (2, "c2"), (3, "c3")]
        assert bodies(store, "t", 1) == [(0, "b0"), (1, "b1"), (2, "b2")]


def test_replicated_append_keeps_the_leaders_offsets_and_checks_continuity(tmp_path):
    with MessageStore(tmp_path / "leader", StoreConfig(**CONFIG)) as leader, \
            MessageStore(tmp_path / "follower", StoreConfig(**CONFIG)) as follower:
        for s in (leader, follower):
            s.create_topic("t", 1)
        leader.append(batch("t", 0, ["x0", "x1", "x2"]))
        records = leader.get("t", 0, 0, 10).records
        first_two = b"".join(map(bytes, records[:2]))
        follower.append_replicated(first_two, zlib.crc32(first_two))
        with pytest.raises(StoreError):  # offset 0 again: a gap/overlap
            follower.append_replicated(bytes(records[0]), zlib.crc32(records[0]))
        third = bytearray(records[2])
        third[-1] ^= 1  # a byte flipped on the way: the chunk CRC catches it, nothing is stored
        with pytest.raises(CorruptRecord):
            follower.append_replicated(third, zlib.crc32(records[2]))
        assert follower.max_offset("t", 0) == 2
        follower.append_replicated(bytes(records[2]), zlib.crc32(records[2]))
        assert bodies(follower, "t", 0) == [(0, "x0"), (1, "x1"), (2, "x2")]
        assert follower.get("t", 0, 0, 10, read_limit=2).next_offset == 2
