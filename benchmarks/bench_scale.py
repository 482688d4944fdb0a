"""Many topics on one broker: what creating them costs, and what it costs everyone else.

One ``gms standalone`` (embedded etcd + nameserver + broker, the broker's default commitlog file
size) on free loopback ports, driven through the public SDK. A live producer (a process of its
own) sends 100 B messages one at a time, each waiting for its acknowledgement, to a topic that
exists before the run, while ``Admin.create_topic`` creates N topics of 4 queues, one call each.

Prints one JSON line:
- ``create_topics_s``: the time to create the N topics; ``create_ms_first`` / ``create_ms_last``:
  the mean time of one create call over the first and the last 10 % of them;
- ``live_send_p50_ms`` / ``live_send_p99_ms`` / ``live_send_max_ms`` / ``live_sends``: the live
  producer's send latencies while the topics are created;
- ``first_send_after_create_s``: from the last create call's return until a send to the last
  created topic is acknowledged (the producer retries a send the broker refuses meanwhile);
- ``data_dir_bytes_per_empty_queue``: the data dir's growth (allocated blocks, as ``du``) over the
  creation, per new queue; ``broker_rss_mb``: the broker's resident memory after the creation.

    python benchmarks/bench_scale.py [--quick] [--topics N]

``--quick``: 300 topics; full: 1,000.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_peers import gms_standalone, pct

QUEUES = 4
PAYLOAD = 100
SETTLE_TIMEOUT_S = 60
FIRST_SEND_TIMEOUT_S = 600
CONSUME_TIMEOUT_S = 600
LIVE_TOPIC = "live"


def allocated_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (st_blocks, as ``du`` counts them)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def send_until_acknowledged(producer: Any, topic: str, payload: bytes, timeout_s: float) -> None:
    """Send to ``topic`` until the broker takes it (a topic it does not know yet is refused)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            producer.send(topic, payload)
            return
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def live_producer(nameserver: str, ready: Any, stop: Any, out: Any) -> None:
    """Send to the live topic one message at a time until ``stop``; put the latencies (ns) in ``out``."""
    from gms.client import Producer

    payload = os.urandom(PAYLOAD)
    clock = time.perf_counter_ns
    lat: list[int] = []
    with Producer(nameserver=nameserver) as producer:
        send_until_acknowledged(producer, LIVE_TOPIC, payload, SETTLE_TIMEOUT_S)
        for _ in range(200):  # warm-up
            producer.send(LIVE_TOPIC, payload)
        ready.set()
        while not stop.is_set():
            t0 = clock()
            producer.send(LIVE_TOPIC, payload)
            lat.append(clock() - t0)
    out.put(lat)


def run(topics: int) -> dict[str, float]:
    from gms.client import Admin, Producer

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, broker_pid):
        data_dir = Path(tmp) / "data"
        admin = Admin(nameserver=nameserver)
        admin.create_topic(LIVE_TOPIC, queues=1)
        ctx = mp.get_context("spawn")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        live = ctx.Process(target=live_producer, args=(nameserver, ready, stop, out), daemon=True)
        live.start()
        if not ready.wait(SETTLE_TIMEOUT_S):
            raise TimeoutError("the live producer did not start")
        bytes_before = allocated_bytes(data_dir)
        times: list[float] = []
        t_start = time.perf_counter()
        for i in range(topics):
            t0 = time.perf_counter()
            admin.create_topic(f"t{i:05d}", queues=QUEUES)
            times.append(time.perf_counter() - t0)
        created = time.perf_counter()
        with Producer(nameserver=nameserver) as producer:
            send_until_acknowledged(producer, f"t{topics - 1:05d}", os.urandom(PAYLOAD), FIRST_SEND_TIMEOUT_S)
        first_send = time.perf_counter() - created
        stop.set()
        lat = sorted(out.get(timeout=SETTLE_TIMEOUT_S))
        live.join(SETTLE_TIMEOUT_S)
        # The creations are done: what the new (all but one empty) queues hold on disk.
        growth = allocated_bytes(data_dir) - bytes_before
        tenth = max(1, topics // 10)
        admin.close()
        return {
            "topics": topics, "queues_per_topic": QUEUES,
            "create_topics_s": created - t_start,
            "create_ms_first": sum(times[:tenth]) / tenth * 1e3,
            "create_ms_last": sum(times[-tenth:]) / tenth * 1e3,
            "live_sends": len(lat),
            "live_send_p50_ms": pct(lat, 50) / 1e6 if lat else -1,
            "live_send_p99_ms": pct(lat, 99) / 1e6 if lat else -1,
            "live_send_max_ms": lat[-1] / 1e6 if lat else -1,
            "first_send_after_create_s": first_send,
            "data_dir_bytes_per_empty_queue": growth / (topics * QUEUES),
            "broker_rss_mb": rss_mb(broker_pid),
        }


def consume_rate(nameserver: str, group: str, topics: list[str], expected: int) -> tuple[float, float]:
    """(messages per second, seconds to join) of a fresh group subscribed to ``topics`` reading from
    the start until it has read ``expected`` messages (every one made and its body touched). As
    kafka-consumer-perf-test reports rebalance and fetch time apart, the rate is timed from the
    Consumer's creation returning (the group joined, its assignment known) to the last message."""
    from gms.client import Consumer

    t0 = time.perf_counter()
    seen = 0
    with Consumer(nameserver=nameserver, group=group, subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False) as consumer:
        joined = time.perf_counter()
        end = time.monotonic() + CONSUME_TIMEOUT_S
        while seen < expected:
            if time.monotonic() > end:
                raise TimeoutError(f"group {group} read {seen} of {expected} messages")
            for message in consumer.poll(1000):
                seen += len(message.body) > 0
        elapsed = time.perf_counter() - joined
    if seen != expected:
        raise RuntimeError(f"group {group} read {seen} messages, {expected} were sent")
    return expected / elapsed, joined - t0


def scenario_consume(quick: bool) -> dict[str, float]:
    """A group subscribed to N topics of 4 queues (quick: 300, full: 1,000) against one topic: the
    same number of 100 B messages (quick: 100k, full: 200k) produced beforehand (not timed), into
    one topic and round-robin over the N, then read by a fresh group from the start."""
    from gms.client import Admin, Producer

    count = 300 if quick else 1000
    messages = 100_000 if quick else 200_000
    many = [f"c{i:05d}" for i in range(count)]
    with tempfile.TemporaryDirectory(prefix="bench-scale-consume-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, _):
        with Admin(nameserver=nameserver) as admin:
            failed = [r for r in admin.create_topics([("one", QUEUES), *((t, QUEUES) for t in many)]) if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} topics not created, first: {failed[0]}")
        payload = os.urandom(PAYLOAD)
        with Producer(nameserver=nameserver) as producer:
            for i in range(messages):
                producer.send_async("one", payload)
                producer.send_async(many[i % count], payload)
            producer.flush()
        one, join_one = consume_rate(nameserver, "g-one", ["one"], messages)
        spread, join_many = consume_rate(nameserver, "g-many", many, messages)
    return {"consume_topics": count, "consume_msgs_per_s_1_topic": one,
            "consume_msgs_per_s_many_topics": spread, "consume_many_topics_ratio": spread / one,
            "consume_join_s_1_topic": join_one, "consume_join_s_many_topics": join_many}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 topics (full: 1,000)")
    parser.add_argument("--topics", type=int, help="the number of topics to create")
    parser.add_argument("--only", choices=["consume"], help="run this scenario only")
    args = parser.parse_args()
    topics = args.topics or (300 if args.quick else 1000)
    figures: dict[str, float] = {}
    if args.only is None:
        figures.update(run(topics))
    if args.only in (None, "consume"):
        figures.update(scenario_consume(args.quick))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    sys.exit(main())
