"""Checkpoint and abort marker: how a restart tells a clean stop from a crash, and where to scan.

``cq_safe_offset`` is a commitlog offset (a record boundary) below which both the commitlog and
every consumeQueue entry were flushed; recovery after a crash scans from there.
"""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from gms.broker.atomic_file import write_atomically

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Checkpoint:
    commitlog_flushed_offset: int
    cq_safe_offset: int
    store_ts_ms: int  # store timestamp of the newest record covered
    written_ms: int


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The last checkpoint; None if there is none or it is damaged (its CRC fails): the store then
    recovers from its oldest commitlog file, as if it had never checkpointed."""
    if not path.exists():
        return None
    try:
        fields = json.loads(path.read_bytes())
        crc = fields.pop("crc32")
        if crc != _crc(fields):
            raise ValueError("CRC mismatch")
        return Checkpoint(**fields)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        log.error("checkpoint %s is damaged (%s): recovering from the oldest commitlog file", path, err)
        return None


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    fields = asdict(checkpoint)
    write_atomically(path, json.dumps({**fields, "crc32": _crc(fields)}).encode())


def _crc(fields: dict) -> int:
    return zlib.crc32(json.dumps(fields, sort_keys=True).encode())


class AbortMarker:
    """Exists while the store is open; found on open, it means the last run did not close."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def found(self) -> bool:
        return self.path.exists()

    def set(self) -> None:
        write_atomically(self.path, b"")

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
