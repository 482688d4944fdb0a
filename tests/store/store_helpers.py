"""Helpers of the storage tests: small files so rolls happen after a few records."""

from __future__ import annotations

from pathlib import Path

from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch

SMALL = {"commitlog_file_size_bytes": 4096, "cq_entries_per_file": 100, "flush_interval_ms": 20,
         "retention_check_interval_ms": 60_000}


def small_config(**overrides) -> StoreConfig:
    return StoreConfig(**{**SMALL, **overrides})


def batch(topic: str = "t", n: int = 10, queue_id: int = 0, body: bytes = b"body", tag: str | None = None,
          start: int = 0) -> bytes:
    return encode_batch([Message(topic, body + b"-%d" % (start + i), tag=tag, queue_id=queue_id)
                         for i in range(n)])


def mapped_kib(under: Path, counters: tuple[str, ...] = ("Rss:",)) -> int:
    """The sum of ``counters`` (KiB) over this process's mappings of files under ``under``
    (/proc/self/smaps): ``Rss:`` what is resident, ``Shared_Dirty:``/``Private_Dirty:`` what
    was written through the map and not written back since."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                inside = len(fields) > 5 and fields[5].startswith(str(under))
            elif inside and fields[0] in counters:
                total += int(fields[1])
    return total
