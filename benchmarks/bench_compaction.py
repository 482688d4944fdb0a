"""In-process benchmark of compacted topics; prints one JSON line.

    python benchmarks/bench_compaction.py [--quick] [--dir PATH]

A key stream where 10 % of the messages' keys are distinct (each key written ~10 times, 200 B
bodies, batches of 100) goes to one compacted queue; then:

- ``cleaner_mb_per_s``: bytes of records the cleaner compacted per second of its pass (the IO
  rate limit lifted; the pass reads, chooses and writes the survivors, synced);
- ``space_reclaimed_ratio``: of those bytes, the fraction compaction removed;
- ``lost_latest_values``: keys whose latest value a reader from the queue's start did not get
  (must be 0);
- ``produce_p99_ratio_cleaner_on``: the p99 latency of appending a batch to another topic while
  the cleaner compacts a backlog at its default IO rate, over the p99 without it (<= 1.2 wanted).
  Appends are paced (a batch every 2 ms), as a broker's sends arrive, not a tight loop.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch, iter_records

BATCH = 100
BODY = b"v" * 200
UNIQUE_FRACTION = 0.1
PACE_S = 0.002
COMPACT = TopicLimits(cleanup_policy="compact", dirty_ratio=0.0, segment_roll_messages=1000)


def keyed_batches(topic: str, count: int, seed: int) -> tuple[list[bytes], dict[str, int]]:
    """Batches of a 10 %-unique key stream, and each key's latest value (its message number)."""
    rng = random.Random(seed)
    n_keys = max(1, int(count * BATCH * UNIQUE_FRACTION))
    batches, latest = [], {}
    for b in range(count):
        messages = []
        for i in range(b * BATCH, (b + 1) * BATCH):
            key = f"key-{rng.randrange(n_keys)}"
            latest[key] = i
            messages.append(Message(topic, b"%d:" % i + BODY, keys=(key,), queue_id=0))
        batches.append(encode_batch(messages))
    return batches, latest


def read_latest(store: MessageStore, topic: str) -> dict[str, int]:
    found: dict[str, int] = {}
    offset = store.min_offset(topic, 0)
    while True:
        got = store.get(topic, 0, offset, 1000, 8 << 20)
        if got.status is not GetStatus.FOUND:
            return found
        for view in got.records:
            for record in iter_records(view, verify_crc=False):
                found[record.keys[0]] = int(bytes(record.body).split(b":")[0])
        offset = got.next_offset


def append_p99_ms(store: MessageStore, batches: list[bytes]) -> float:
    """The p99 of paced appends of ``batches`` (one every PACE_S)."""
    latencies = []
    next_at = time.perf_counter()
    for batch in batches:
        next_at += PACE_S
        start = time.perf_counter()
        store.append(batch)
        latencies.append(time.perf_counter() - start)
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return float(np.percentile(latencies, 99)) * 1000


def bench_cleaner(root: Path, n_batches: int) -> dict[str, float | int]:
    config = StoreConfig(commitlog_file_size_bytes=64 << 20, compaction_io_bytes_per_s=1 << 40,
                         compaction_check_interval_ms=3_600_000)
    batches, latest = keyed_batches("c", n_batches, seed=1)
    with MessageStore(root, config) as store:
        store.create_topic("c", 1, COMPACT)
        for batch in batches:
            store.append(batch)
        input_bytes = sum(len(b) for b in batches)
        start = time.perf_counter()
        store.compact()
        elapsed = time.perf_counter() - start
        found = read_latest(store, "c")
        kept_bytes = sum(f.stat().st_size for f in store.paths.compacted.rglob("*.seg"))
    compacted_bytes = input_bytes  # every record below the point (all: a multiple of the roll)
    lost = sum(1 for key, value in latest.items() if found.get(key) != value)
    return {"cleaner_mb_per_s": round(compacted_bytes / elapsed / 1e6, 1),
            "space_reclaimed_ratio": round(1 - kept_bytes / compacted_bytes, 3),
            "lost_latest_values": lost, "compacted_messages": n_batches * BATCH}


def bench_produce_p99(root: Path, n_backlog: int, n_paced: int) -> dict[str, float]:
    config = StoreConfig(commitlog_file_size_bytes=64 << 20, compaction_check_interval_ms=3_600_000)
    backlog, _ = keyed_batches("c", n_backlog, seed=2)
    paced = [encode_batch([Message("p", BODY, queue_id=0)] * BATCH)] * n_paced
    with MessageStore(root, config) as store:
        store.create_topic("c", 1, COMPACT)
        store.create_topic("p", 1)
        for batch in backlog:
            store.append(batch)
        append_p99_ms(store, paced[: n_paced // 4])  # warm-up
        off = append_p99_ms(store, paced)
        cleaning = threading.Thread(target=store.compact)
        cleaning.start()
        on = append_p99_ms(store, paced)
        busy = cleaning.is_alive()  # the cleaner ran for the whole measured stretch
        cleaning.join()
    return {"produce_p99_ms_cleaner_off": round(off, 3), "produce_p99_ms_cleaner_on": round(on, 3),
            "produce_p99_ratio_cleaner_on": round(on / off, 2), "cleaner_busy_throughout": busy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="seconds instead of a minute")
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temporary directory)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-compaction-", dir=args.dir))
    n_batches, n_paced = (4000, 600) if args.quick else (10_000, 1500)
    try:
        result = {**bench_cleaner(base / "cleaner", n_batches),
                  **bench_produce_p99(base / "p99", n_batches, n_paced), "quick": args.quick}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
