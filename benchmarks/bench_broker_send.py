"""Broker-only send benchmark: a broker process driven by a raw ``gms.net.Connection`` (no SDK).

Prints one JSON line: single-send round trip p50/p99 in µs (one 100 B record at a time, async
flush), pipelined single-record sends/s (64 in flight on one connection), and sync-flush
single-record sends/s with 64 concurrent senders (each waits for the group-commit fdatasync);
with each throughput, the broker process's CPU time per send (user + system, all threads),
which the client sharing the machine does not blur.
Compare with ``bench_rpc.py`` (PING round trip) to see what the broker's send work costs::

    python benchmarks/bench_broker_send.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench_procs import start_server

from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import encode_record

TOPIC = "bench"
QUEUES = 4
IN_FLIGHT = 64
COMMITLOG_FILE_SIZE_BYTES = 256 << 20  # keeps the benchmark's disk use small


def _start_broker(root: Path, flush_mode: str) -> tuple[subprocess.Popen, int]:
    return start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"), "--flush", flush_mode,
                        "--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (fields 14-15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


async def _throughput(conn: Connection, records: list[bytes], seconds: float, pid: int) -> tuple[float, float]:
    """Single-record sends per second with IN_FLIGHT requests outstanding, and broker CPU µs per send."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def sender(i: int) -> None:
        nonlocal done
        record = records[i % len(records)]
        while time.perf_counter() < deadline:
            await conn.request(RequestCode.SEND, {}, record)
            done += 1

    start, cpu_start = time.perf_counter(), _cpu_s(pid)
    await asyncio.gather(*(sender(i) for i in range(IN_FLIGHT)))
    return done / (time.perf_counter() - start), (_cpu_s(pid) - cpu_start) * 1e6 / done


async def _measure(port: int, pid: int, sequential: int, seconds: float, latency: bool) -> dict:
    conn = await Connection.open("127.0.0.1", port)
    await conn.request(RequestCode.CREATE_TOPIC, {"topic": TOPIC, "queues": QUEUES})
    records = [encode_record(topic=TOPIC, body=b"x" * 100, tag="t", queue_id=q) for q in range(QUEUES)]
    out: dict = {}
    if latency:
        for i in range(1000):  # warm up both ends
            await conn.request(RequestCode.SEND, {}, records[i % QUEUES])
        clock = time.perf_counter_ns
        samples_us = []
        for i in range(sequential):
            start = clock()
            await conn.request(RequestCode.SEND, {}, records[i % QUEUES])
            samples_us.append((clock() - start) / 1000)
        samples_us.sort()
        out = {"send_p50_us": round(_percentile(samples_us, 0.5), 1),
               "send_p99_us": round(_percentile(samples_us, 0.99), 1)}
    sends_per_s, cpu_us = await _throughput(conn, records, seconds, pid)
    out["sends_per_s"], out["cpu_us"] = round(sends_per_s), round(cpu_us, 1)
    conn.close()
    return out


def _run_broker(flush_mode: str, sequential: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="gms-bench-send-") as tmp:
        proc, port = _start_broker(Path(tmp), flush_mode)
        try:
            return run(_measure(port, proc.pid, sequential, seconds, latency=flush_mode == "async"))
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds instead of ~15")
    args = parser.parse_args()
    sequential, seconds = (5000, 2.0) if args.quick else (30000, 5.0)
    async_flush = _run_broker("async", sequential, seconds)
    sync_flush = _run_broker("sync", sequential, seconds)
    print(json.dumps({
        "send_p50_us": async_flush["send_p50_us"],
        "send_p99_us": async_flush["send_p99_us"],
        "pipelined_sends_per_s": async_flush["sends_per_s"],
        "pipelined_broker_cpu_us_per_send": async_flush["cpu_us"],
        "sync_flush_sends_per_s": sync_flush["sends_per_s"],
        "sync_flush_broker_cpu_us_per_send": sync_flush["cpu_us"],
        "in_flight": IN_FLIGHT,
        "body_bytes": 100,
        "quick": args.quick,
    }))


if __name__ == "__main__":
    main()
