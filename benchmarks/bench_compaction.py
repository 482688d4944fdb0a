"""In-process benchmark of compacted topics; prints one JSON line.

    python benchmarks/bench_compaction.py [--quick] [--dir PATH]

A key stream where 10 % of the messages' keys are distinct (each key written ~10 times, 200 B
bodies, batches of 100) goes to one compacted queue; then:

- ``cleaner_mb_per_s``: bytes of records the cleaner compacted per second of its pass (the IO
  rate limit lifted; the pass starts its worker process, which reads, chooses and writes the
  survivors, synced, at the lowest CPU priority: on a busy host it gets what is left);
- ``space_reclaimed_ratio``: of those bytes, the fraction compaction removed;
- ``lost_latest_values``: keys whose latest value a reader from the queue's start did not get
  (must be 0);
- ``produce_p99_ratio_cleaner_on``: on a broker process (async flush), the p99 round trip of
  one-message sends to another topic, paced one a millisecond, while its cleaner compacts the
  same backlog at its default IO rate, over the p99 with it idle (<= 1.2 wanted). The backlog
  is split over eight topics compacted in turn; each pass is measured whole (the sends from when
  it builds its job, which makes the queue's compacted log directory, until its compacted log
  appears there: ``sends_cleaner_on`` in all), and after each as many sends with the cleaner
  idle, so that load from elsewhere on a shared host falls on both kinds alike (and an idle
  window before the first pass). The sends are the same in every window (pace, topic, record),
  on the same store. ``produce_p99_ratio_pass_median`` is the median over the passes of a pass's
  p99 over the p99 of the idle window after it: on a host shared with other work, one burst of
  it (a 40 ms stall is 40 slow sends, the pooled p99's whole tail) decides the pooled ratio; it
  moves the median of eight pairs little. ``broker_cleaner_mb_per_s`` is the backlog's bytes
  over the time from lifting the lags to the passes' ends: the rate the cleaner compacted at
  meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_procs import start_server, stop_servers

from gms.broker.store import GetStatus, MessageStore
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store_config import StoreConfig
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch, encode_record, iter_records

BATCH = 100
BODY = b"v" * 200
UNIQUE_FRACTION = 0.1
PACE_S = 0.001
IN_FLIGHT = 16
CLEANER_INTERVAL_MS = 200
SETTLE_S = 1.0
ROUNDS = 8  # compactions the p99's windows alternate with: load from elsewhere hits both kinds alike
COMPACT_SETTINGS = {"cleanup_policy": "compact", "dirty_ratio": 0.0, "segment_roll_messages": 1000}
COMPACT = TopicLimits(**COMPACT_SETTINGS)


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


async def _paced_sends(conn: Connection, record: bytes, count: int | None = None,
                       pass_dir: Path | None = None) -> list[float]:
    """The round trips (s) of one-record sends, one every PACE_S: ``count`` of them, or those of
    a compaction pass, from when the pass makes the queue's compacted log directory ``pass_dir``
    (when it builds its job) to when its compacted log appears there (the sends before the
    pass began are not counted). The directory is looked at between sends, not the broker asked:
    the watch costs the broker nothing."""
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    next_at, begun = loop.time(), pass_dir is None
    while True:
        if pass_dir is not None:
            begun = begun or pass_dir.is_dir()
            if begun and any(name.endswith(".seg") for name in os.listdir(pass_dir)):
                return latencies
        next_at += PACE_S
        start = time.perf_counter()
        await conn.request(RequestCode.SEND, {}, record)
        if begun:
            latencies.append(time.perf_counter() - start)
        if count is not None and len(latencies) >= count:
            return latencies
        await asyncio.sleep(max(0.0, next_at - loop.time()))


def _p99_ms(latencies: list[float]) -> float:
    return float(np.percentile(latencies, 99)) * 1000


async def _fill(conn: Connection, batches: list[bytes]) -> None:
    pending = iter(batches)

    async def sender() -> None:
        for batch in pending:
            await conn.request(RequestCode.SEND, {}, batch)
    await asyncio.gather(*(sender() for _ in range(IN_FLIGHT)))


async def _measure_p99(port: int, store: Path, backlogs: list[list[bytes]], n_sends: int) -> dict[str, float | int]:
    """Windows of paced sends, the cleaner idle and compacting in turn: an idle one, then for
    each backlog (a topic of its own) one from lifting its lag to the end of its pass and one
    of as many sends after it."""
    conn = await Connection.open("127.0.0.1", port)
    try:
        held = {**COMPACT_SETTINGS, "min_compaction_lag_ms": 3_600_000}  # the cleaner waits
        for i in range(len(backlogs)):
            await conn.request(RequestCode.CREATE_TOPIC, {"topic": f"c{i}", "queues": 1, "settings": held})
        await conn.request(RequestCode.CREATE_TOPIC, {"topic": "p", "queues": 1})
        for backlog in backlogs:
            await _fill(conn, backlog)
        await asyncio.sleep(SETTLE_S)  # the backlog's pages written back
        record = encode_record(topic="p", body=BODY, queue_id=0)
        await _paced_sends(conn, record, n_sends // 4)  # warm-up
        off, on, pass_s, pairs = await _paced_sends(conn, record, n_sends // len(backlogs)), [], 0.0, []
        for i in range(len(backlogs)):
            released = time.perf_counter()
            await conn.request(RequestCode.UPDATE_TOPIC, {"topic": f"c{i}", "settings": {"min_compaction_lag_ms": 0}})
            during = await _paced_sends(conn, record, pass_dir=store / "compacted" / f"c{i}" / "0")
            pass_s += time.perf_counter() - released
            await asyncio.sleep(SETTLE_S)  # the compacted log's pages written back
            after = await _paced_sends(conn, record, len(during))  # as many, the cleaner idle
            on, off, pairs = on + during, off + after, [*pairs, _p99_ms(during) / _p99_ms(after)]
    finally:
        conn.close()
    return {"produce_p99_ms_cleaner_off": round(_p99_ms(off), 3), "produce_p99_ms_cleaner_on": round(_p99_ms(on), 3),
            "produce_p99_ratio_cleaner_on": round(_p99_ms(on) / _p99_ms(off), 2),
            "produce_p99_ratio_pass_median": round(float(np.median(pairs)), 2), "sends_cleaner_on": len(on),
            "broker_cleaner_mb_per_s": round(sum(len(b) for part in backlogs for b in part) / pass_s / 1e6, 1)}


def bench_produce_p99(root: Path, n_backlog: int, n_sends: int) -> dict[str, float | int]:
    """Paced sends to a broker's delete topic, p99, before and while its cleaner compacts a
    backlog of another topic at the default IO rate."""
    config = root / "broker.toml"
    root.mkdir(parents=True)
    config.write_text(f"[store]\ncompaction_check_interval_ms = {CLEANER_INTERVAL_MS}\n")
    proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"), "--config",
                              str(config), "--commitlog-file-size", str(256 << 20))
    try:
        backlogs = [keyed_batches(f"c{i}", n_backlog // ROUNDS, seed=2 + i)[0] for i in range(ROUNDS)]
        return run(_measure_p99(port, root / "store" / "store", backlogs, n_sends))
    finally:
        stop_servers([proc])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="seconds instead of a minute")
    parser.add_argument("--dir", type=Path, help="where the stores go (default: a temporary directory)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-compaction-", dir=args.dir))
    n_batches, n_sends = (4000, 1000) if args.quick else (10_000, 3000)
    try:
        result = {**bench_cleaner(base / "cleaner", n_batches),
                  **bench_produce_p99(base / "p99", n_batches, n_sends), "quick": args.quick}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
