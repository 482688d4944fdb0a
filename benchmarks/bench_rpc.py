"""RPC layer benchmark: PING round trips over loopback, server in its own process.

Prints one JSON line: round-trip p50/p99 in µs for 100 B requests sent one at a time, and
requests/s with many requests pipelined on one connection. Usage::

    python benchmarks/bench_rpc.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from gms.net import Connection, RpcServer, run
from gms.protocol.codes import RequestCode

BODY_100B = b"x" * 100


async def serve() -> None:
    """Child process: serve PING on a free port, print it, run until stdin closes."""
    server = RpcServer()
    await server.start("127.0.0.1", 0)
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop()


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


async def measure(port: int, requests_sequential: int, pipelined_s: float, window: int) -> dict:
    conn = await Connection.open("127.0.0.1", port)
    clock = time.perf_counter_ns
    for _ in range(1000):  # warm up both ends
        await conn.request(RequestCode.PING, None, BODY_100B)
    samples_us = []
    for _ in range(requests_sequential):
        start = clock()
        await conn.request(RequestCode.PING, None, BODY_100B)
        samples_us.append((clock() - start) / 1000)
    samples_us.sort()

    done = 0
    deadline = time.perf_counter() + pipelined_s

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await conn.request(RequestCode.PING, None, BODY_100B)
            done += 1

    start_s = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    elapsed_s = time.perf_counter() - start_s
    conn.close()
    return {
        "rtt_p50_us": round(percentile(samples_us, 0.50), 1),
        "rtt_p99_us": round(percentile(samples_us, 0.99), 1),
        "rtt_mean_us": round(statistics.fmean(samples_us), 1),
        "pipelined_requests_per_s": round(done / elapsed_s),
        "pipeline_window": window,
        "body_bytes": len(BODY_100B),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds instead of ~10")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(serve())
        return
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        sequential, pipelined_s = (5000, 1.0) if args.quick else (30000, 3.0)
        print(json.dumps(run(measure(port, sequential, pipelined_s, window=64))))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(10)


if __name__ == "__main__":
    main()
