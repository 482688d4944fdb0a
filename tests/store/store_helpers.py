"""Helpers of the storage tests: small files so rolls happen after a few records."""

from __future__ import annotations

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
