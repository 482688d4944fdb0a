"""Replication benchmark: 3 brokers and a nameserver on this machine; one JSON line with

- ``unreplicated_msgs_per_s``: acks=1 produce throughput to a topic with 1 replica;
- ``acks1_msgs_per_s`` / ``acks_all_msgs_per_s``: the same with 3 replicas (min ISR 2), acks 1
  and acks -1 (target: acks -1 >= 50 % of unreplicated acks 1);
- ``acks_all_p99_us``: latency p99 of single-message acks=-1 sends, one at a time;
- ``failover_s``: from SIGKILL of a queue's leader to the first successful acks=-1 send on the
  new leader (lease TTL ``--lease-ttl-s``, default 10 s: the controller can only act once the
  dead broker's lease expires, so a shorter TTL fails over faster at the cost of more
  keep-alive traffic and more false failovers under pauses).

Producers pipeline pre-encoded batches of 100-byte messages straight over the wire protocol
(no SDK batching in the measurement), one connection per queue leader.

    python benchmarks/bench_replication.py [--quick] [--lease-ttl-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_procs import start_cluster, stop_servers

from gms.errors import GmsError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch

QUEUES = 3
BODY = b"x" * 100
BATCH_MESSAGES = 100
WINDOW = 32  # batches in flight per queue (the same for every mode)
START_TIMEOUT_S = 30


async def request(address: str, code: int, fields: dict[str, object], body: bytes = b"") -> dict[str, object]:
    host, port = address.rsplit(":", 1)
    conn = await Connection.open(host, int(port))
    try:
        return dict((await conn.request(code, fields, body)).fields)
    finally:
        conn.close()


async def leaders(nameserver: str, topic: str) -> dict[int, str]:
    route = await request(nameserver, RequestCode.GET_ROUTE, {"topic": topic})
    return {q["queue_id"]: q["leader"] for q in route["queues"] if q["leader"]}


async def create_topic(nameserver: str, topic: str, replicas: int) -> dict[int, str]:
    settings = {"min_insync_replicas": 2} if replicas > 1 else {}
    await request(nameserver, RequestCode.CREATE_TOPIC,
                  {"topic": topic, "queues": QUEUES, "replicas": replicas, "settings": settings})
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # every leader has the queue and (acks=-1) a full enough ISR
        try:
            found = await leaders(nameserver, topic)
            for q, address in found.items():
                body = encode_batch([Message(topic=topic, body=b"warm", queue_id=q)])
                await request(address, RequestCode.SEND, {"acks": -1}, body)
            return found
        except GmsError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def caught_up(topic: str, leaders_by_queue: dict[int, str]) -> None:
    """Wait until the followers have every record of ``topic``: an acks=-1 send to each queue is
    answered once the high watermark covers it (and so everything before it)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for q, address in leaders_by_queue.items():
        body = encode_batch([Message(topic=topic, body=b"settle", queue_id=q)])
        while True:
            try:
                await request(address, RequestCode.SEND, {"acks": -1}, body)
                break
            except GmsError:  # the send timed out while the followers were still catching up
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def throughput(topic: str, leaders_by_queue: dict[int, str], acks: int, duration_s: float) -> float:
    sent = 0

    async def produce(queue_id: int, address: str) -> None:
        nonlocal sent
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        body = encode_batch([Message(topic=topic, body=BODY, queue_id=queue_id)] * BATCH_MESSAGES)
        deadline = time.perf_counter() + duration_s

        async def lane() -> None:
            nonlocal sent
            while time.perf_counter() < deadline:
                await conn.request(RequestCode.SEND_BATCH, {"acks": acks}, body)
                sent += BATCH_MESSAGES

        try:
            await asyncio.gather(*(lane() for _ in range(WINDOW)))
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(produce(q, a) for q, a in leaders_by_queue.items()))
    return sent / (time.perf_counter() - started)


async def latency_p99_us(topic: str, address: str, count: int) -> float:
    host, port = address.rsplit(":", 1)
    conn = await Connection.open(host, int(port))
    body = encode_batch([Message(topic=topic, body=BODY, queue_id=0)])
    samples = np.empty(count)
    try:
        for i in range(count):
            t0 = time.perf_counter_ns()
            await conn.request(RequestCode.SEND, {"acks": -1}, body)
            samples[i] = (time.perf_counter_ns() - t0) / 1000
    finally:
        conn.close()
    return float(np.percentile(samples, 99))


async def failover_s(nameserver: str, topic: str, brokers: dict[str, subprocess.Popen[bytes]]) -> float:
    old = (await leaders(nameserver, topic))[0]
    body = encode_batch([Message(topic=topic, body=b"after failover", queue_id=0)])
    os.kill(brokers[old].pid, signal.SIGKILL)
    killed = time.monotonic()
    while time.monotonic() - killed < 120:
        try:
            new = (await leaders(nameserver, topic)).get(0)
            if new and new != old:
                await request(new, RequestCode.SEND, {"acks": -1}, body)
                return time.monotonic() - killed
        except GmsError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("no new leader accepted an acks=-1 send within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="short runs (whole benchmark <= 120 s)")
    parser.add_argument("--lease-ttl-s", type=int, default=10)
    args = parser.parse_args()
    duration_s = 4.0 if args.quick else 15.0
    with tempfile.TemporaryDirectory(prefix="gms-bench-repl-") as tmp:
        root = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            nameserver, brokers = start_cluster(root, procs, f"[broker]\nlease_ttl_s = {args.lease_ttl_s}\n"
                                                             "[store]\ncommitlog_file_size_bytes = 268435456\n")
            result = run(measure(nameserver, brokers, duration_s, 300 if args.quick else 2000))
        finally:
            stop_servers(procs)
    print(json.dumps(result))


async def measure(nameserver: str, brokers: dict[str, subprocess.Popen[bytes]], duration_s: float,
                  latency_sends: int) -> dict[str, float]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while len((await request(nameserver, RequestCode.GET_BROKER_LIST, {}))["brokers"]) < 3:
        if time.monotonic() > deadline:
            raise RuntimeError("brokers did not register")
        await asyncio.sleep(0.1)
    plain = await create_topic(nameserver, "bench-r1", 1)
    replicated = await create_topic(nameserver, "bench-r3", 3)
    result = {
        "unreplicated_msgs_per_s": round(await throughput("bench-r1", plain, 1, duration_s)),
        "acks1_msgs_per_s": round(await throughput("bench-r3", replicated, 1, duration_s)),
    }
    await caught_up("bench-r3", replicated)  # not the acks=1 phase's backlog in the acks=-1 figure
    result |= {
        "acks_all_msgs_per_s": round(await throughput("bench-r3", replicated, -1, duration_s)),
        "acks_all_p99_us": round(await latency_p99_us("bench-r3", replicated[0], latency_sends)),
    }
    result["failover_s"] = round(await failover_s(nameserver, "bench-r3", brokers), 2)
    return result


if __name__ == "__main__":
    main()
