"""Configuration of the message store: one frozen dataclass, keyword-only, units in the names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gms.record import BLANK_MARKER_SIZE, HEADER_SIZE

GIB = 1 << 30
MIB = 1 << 20
PAGE_SIZE_BYTES = 4096
COMMITLOG_FILE_SIZE_MIN_BYTES = 4096  # tests use one page; anything smaller cannot hold a record


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    commitlog_file_size_bytes: int = GIB
    cq_entries_per_file: int = 300_000
    flush_mode: Literal["async", "sync"] = "async"
    flush_interval_ms: int = 500  # async: flush at least this often when anything is dirty
    flush_every_messages: int = 0  # async: Metaq's "force every N messages" (0 = interval only)
    flush_least_pages: int = 4  # async: a message-count flush waits for this many dirty pages
    retention_hours: float = 72.0
    retention_check_interval_ms: int = 10_000
    # The cleaner of compacted topics (docs/storage-format.md "Compacted topics"): a pass over the
    # compacted queues this often, reading and writing at most this many bytes a second.
    compaction_check_interval_ms: int = 15_000
    compaction_io_bytes_per_s: int = 32 * MIB
    disk_usage_max_bytes: int | None = None
    body_size_max_bytes: int = 4 * MIB
    warm_next_file: bool = True  # create and pre-fault the next commitlog file in the background
    checkpoint_interval_ms: int = 1_000
    # Key index files (RocketMQ's IndexFile: 5 M slots, 20 M entries): 2 MiB of slots and 54 MiB of
    # entries each, about 4 entries per slot chain when full. Files are allocated when created.
    key_index_slots: int = 500_000
    key_index_entries_per_file: int = 2_000_000
    verify_tag_hash: bool = True  # check each distinct tag's xxhash64 on append (cheap: per tag, not per record)
    # How far ahead a scheduled message may be delivered (RocketMQ 5's timerMaxDelaySec: 3 days; ours 7).
    schedule_max_delay_ms: int = 7 * 24 * 3600 * 1000
    # How long an idle idempotent producer's sequences are kept (Kafka's producer.id.expiration.ms).
    producer_state_expiry_ms: int = 24 * 3600 * 1000

    def __post_init__(self) -> None:
        if self.commitlog_file_size_bytes < COMMITLOG_FILE_SIZE_MIN_BYTES:
            raise ValueError(f"commitlog_file_size_bytes must be >= {COMMITLOG_FILE_SIZE_MIN_BYTES}")
        if self.cq_entries_per_file < 1:
            raise ValueError("cq_entries_per_file must be >= 1")
        if self.key_index_slots < 1 or self.key_index_entries_per_file < 1:
            raise ValueError("key_index_slots and key_index_entries_per_file must be >= 1")
        if self.flush_mode not in ("async", "sync"):
            raise ValueError(f"flush_mode must be 'async' or 'sync', not {self.flush_mode!r}")
        if self.compaction_check_interval_ms <= 0 or self.compaction_io_bytes_per_s <= 0:
            raise ValueError("compaction_check_interval_ms and compaction_io_bytes_per_s must be positive")
        if self.flush_interval_ms <= 0 or self.retention_check_interval_ms <= 0:
            raise ValueError("intervals must be positive")
        if self.flush_every_messages < 0 or self.flush_least_pages < 0:
            raise ValueError("flush thresholds must be >= 0")
        if self.schedule_max_delay_ms < 0 or self.producer_state_expiry_ms < 0:
            raise ValueError("schedule_max_delay_ms and producer_state_expiry_ms must be >= 0")
        if self.body_size_max_bytes < 1:
            raise ValueError("body_size_max_bytes must be >= 1")
        if self.disk_usage_max_bytes is not None and self.disk_usage_max_bytes < 0:
            raise ValueError("disk_usage_max_bytes must be >= 0")

    @property
    def record_size_max_bytes(self) -> int:
        """The largest record a commitlog file can hold (it must leave room for a blank marker)."""
        return self.commitlog_file_size_bytes - BLANK_MARKER_SIZE

    @property
    def retention_ms(self) -> int:
        return int(self.retention_hours * 3_600_000)


assert HEADER_SIZE < COMMITLOG_FILE_SIZE_MIN_BYTES
