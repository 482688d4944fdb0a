"""The store implementations the conformance suite runs against (test_store_conformance.py):
each opens a store that offers gms.broker.store.StoreAPI, and knows how to tear the tail of its
own files the way a crash mid-write does."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gms import record as rec
from gms.broker.store import MessageStore, StoreAPI
from gms.broker.store_config import StoreConfig

# Small files: a few records roll the commitlog and the index.
CONFIG = {"commitlog_file_size_bytes": 64 * 1024, "cq_entries_per_file": 100, "flush_interval_ms": 20,
          "retention_check_interval_ms": 600_000}


class StoreImpl(NamedTuple):
    open: Callable[[Path, dict], StoreAPI]  # (root, config overrides) -> an open store
    tear_tail: Callable[[Path, int], None]  # write half a record at this commitlog end, as a crash does


def _open_message_store(root: Path, overrides: dict) -> StoreAPI:
    return MessageStore.open(root, StoreConfig(**{**CONFIG, **overrides}))


def _tear_message_store(root: Path, end: int) -> None:
    """The header of a record at ``end`` and a little of its body, its CRC not sealed."""
    files = sorted((root / "commitlog").iterdir(), key=lambda p: int(p.name))
    path = next(p for p in reversed(files) if int(p.name) <= end)
    torn = bytearray(rec.encode_record(topic="t", body=b"torn" * 20))
    struct.pack_into(">I", torn, rec.OFF_CRC, 0xDEADBEEF)
    with open(path, "r+b") as f:
        f.seek(end - int(path.name))
        f.write(torn[: len(torn) // 2])


IMPLEMENTATIONS: dict[str, StoreImpl] = {
    "message_store": StoreImpl(_open_message_store, _tear_message_store),
}
