"""Checkpoint and abort marker: how a restart tells a clean stop from a crash, and where to scan.

``cq_safe_offset`` is a commitlog offset (a record boundary) below which both the commitlog and
every consumeQueue entry were flushed; recovery after a crash scans from there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gms.broker.atomic_file import write_atomically
from gms.store_errors import StoreCorrupt

CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_flushed_offset: int
    cq_safe_offset: int
    store_ts_ms: int  # store timestamp of the newest record covered
    written_ms: int


def read_checkpoint(root: Path) -> Checkpoint | None:
    path = root / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        return Checkpoint(**json.loads(path.read_bytes()))
    except (ValueError, TypeError) as err:
        raise StoreCorrupt(f"unreadable checkpoint {path}: {err}") from err


def write_checkpoint(root: Path, checkpoint: Checkpoint) -> None:
    write_atomically(root / CHECKPOINT_FILE, json.dumps(asdict(checkpoint)).encode())


class AbortMarker:
    """Exists while the store is open; found on open, it means the last run did not close."""

    def __init__(self, root: Path) -> None:
        self.path = root / ABORT_FILE

    def found(self) -> bool:
        return self.path.exists()

    def set(self) -> None:
        write_atomically(self.path, b"")

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
