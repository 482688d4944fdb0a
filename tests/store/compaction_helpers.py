"""Keyed records of the compaction tests: record ``seq`` has key ``k<seq % KEYS>`` and body
``seq``; every 7th is a tombstone."""

from __future__ import annotations

from pathlib import Path

from gms.broker.store import GetStatus, MessageStore
from gms.record import Message, decode_record, encode_batch
from gms.record.layout import TOMBSTONE_PROPERTY

TOPIC = "compacted"
KEYS = 13


def is_tombstone(seq: int) -> bool:
    return seq % 7 == 6


def keyed_batch(first: int, n: int, topic: str = TOPIC, keys: int = KEYS) -> bytes:
    return encode_batch([Message(topic, b"%d" % seq, keys=(f"k{seq % keys}",), queue_id=0,
                                 properties={TOMBSTONE_PROPERTY: "1"} if is_tombstone(seq) else None)
                         for seq in range(first, first + n)])


def read_all(store: MessageStore, topic: str = TOPIC, queue_id: int = 0) -> list[tuple[int, str, int, bool]]:
    """(queue offset, key, body as int, tombstone) of every record served from the queue's start."""
    found = []
    offset = store.min_offset(topic, queue_id)
    while True:
        got = store.get(topic, queue_id, offset, 64)
        if got.status is GetStatus.NO_NEW_MESSAGE:
            return found
        assert got.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), got
        assert not got.damaged
        for view in got.records:
            r = decode_record(view)
            found.append((r.queue_offset, " ".join(r.keys), int(bytes(r.body)), TOMBSTONE_PROPERTY in r.properties))
        assert got.next_offset > offset
        offset = got.next_offset


def latest_per_key(found: list[tuple[int, str, int, bool]]) -> dict[str, tuple[int, bool]]:
    latest: dict[str, tuple[int, bool]] = {}
    for _, key, seq, tomb in found:
        latest[key] = (seq, tomb)
    return latest


def compaction_workers(parent: int) -> list[int]:
    """The pids of ``parent``'s compaction worker processes (see broker/clean_worker.py)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and b"clean_worker" in (entry / "cmdline").read_bytes()
                    and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def running(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
