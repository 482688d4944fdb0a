"""In-process benchmark of the message store; prints one JSON line.

    python benchmarks/bench_store.py [--quick] [--dir PATH]

Batches are encoded before the timed regions (that is the producer's work). Figures:
append_msgs_per_s (100 B bodies, batches of 1,000, async flush, consumeQueue dispatch included),
append_mb_per_s_1k (1 KiB bodies), read_msgs_per_s (sequential ``get`` of one queue through its
consumeQueue), tag_filter_msgs_per_s (matching messages returned per second when 1 entry in 10
matches), recover_s_per_gib (crash recovery of 100 B records scaled to 1 GiB), rss_anon_mb peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.paths import CHECKPOINT_FILE
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch, tag_hash

BATCH_MSGS = 1000
TAGS = [f"tag{i}" for i in range(10)]


_peak_anon_mb = [0.0]


def rss_anon_mb() -> float:
    """Current anonymous RSS (the mapped store files are file-backed and not counted)."""
    anon = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024
    _peak_anon_mb[0] = max(_peak_anon_mb[0], anon)
    return anon


def make_batches(count: int, body_bytes: int, queue_count: int) -> list[bytes]:
    body = os.urandom(body_bytes)
    return [encode_batch([Message("bench", body, tag=TAGS[i % 10], queue_id=b % queue_count)
                          for i in range(BATCH_MSGS)]) for b in range(count)]


def bench_append(root: Path, batches: list[bytes], config: StoreConfig) -> tuple[float, float]:
    """Seconds to append all batches but the first, and the anonymous memory growth meanwhile."""
    with MessageStore(root, config) as store:
        store.create_topic("bench", 4)
        store.append(batches[0])  # warm-up: file creation, first pages
        anon_before = rss_anon_mb()
        start = time.perf_counter()
        for batch in batches[1:]:
            store.append(batch)
        elapsed = time.perf_counter() - start
        growth = rss_anon_mb() - anon_before
    return elapsed, growth


def bench_read(root: Path, config: StoreConfig, tag_filter: frozenset[int] | None) -> float:
    """Messages returned per second reading queue 0 from the start."""
    with MessageStore(root, config) as store:
        got, offset = 0, 0
        start = time.perf_counter()
        while True:
            result = store.get("bench", 0, offset, max_msgs=1000, tag_hashes=tag_filter)
            if result.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                break
            got += len(result.records)
            offset = result.next_offset
        elapsed = time.perf_counter() - start
        del result
    return got / elapsed


def bench_recover(root: Path, config: StoreConfig) -> float:
    """Crash recovery time of everything in ``root``, scaled to 1 GiB of commitlog."""
    (root / CHECKPOINT_FILE).unlink()
    (root / "abort").write_bytes(b"")
    shutil.rmtree(root / "consumequeue")
    start = time.perf_counter()
    store = MessageStore.open(root, config)
    elapsed = time.perf_counter() - start
    size = store._commitlog.committed_pos - store._commitlog.min_offset
    store.close()
    return elapsed * (1 << 30) / size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="about 30 s instead of minutes")
    parser.add_argument("--dir", default=None, help="where to put the store (default: a temp dir)")
    args = parser.parse_args()
    n_small, n_large = (1000, 300) if args.quick else (5000, 1500)
    config = StoreConfig(flush_mode="async")
    base = Path(tempfile.mkdtemp(prefix="gms-bench-", dir=args.dir))
    try:
        small = make_batches(n_small, 100, 4)
        elapsed, growth_mb = bench_append(base / "small", small, config)
        append_msgs = (len(small) - 1) * BATCH_MSGS / elapsed
        del small
        large = make_batches(n_large, 1024, 4)
        elapsed, _ = bench_append(base / "large", large, config)
        append_mb_1k = (len(large) - 1) * BATCH_MSGS * 1024 / elapsed / 1e6
        del large
        shutil.rmtree(base / "large")
        read = bench_read(base / "small", config, None)
        tag_filter = bench_read(base / "small", config, frozenset({tag_hash(TAGS[3])}))
        recover = bench_recover(base / "small", config)
        rss_anon_mb()
        print(json.dumps({
            "append_msgs_per_s": round(append_msgs),
            "append_mb_per_s_1k": round(append_mb_1k, 1),
            "read_msgs_per_s": round(read),
            "tag_filter_msgs_per_s": round(tag_filter),
            "recover_s_per_gib": round(recover, 2),
            "rss_anon_mb": round(_peak_anon_mb[0], 1),  # includes the pre-encoded batches
            "rss_anon_growth_append_mb": round(growth_mb, 1),
            "quick": args.quick,
        }))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
