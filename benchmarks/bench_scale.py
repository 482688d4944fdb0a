"""Many topics on one broker: what creating them costs, and what it costs everyone else.

One ``gms standalone`` (embedded etcd + nameserver + broker, the broker's default commitlog file
size) on free loopback ports, driven through the public SDK. A live producer (a process of its
own) sends 100 B messages one at a time, each waiting for its acknowledgement, to a topic that
exists before the run, while ``Admin.create_topic`` creates N topics of 4 queues, one call each,
and then while ``Admin.delete_topics`` deletes them again.

Prints one JSON line:
- ``create_topics_s``: the time to create the N topics; ``create_ms_first`` / ``create_ms_last``:
  the mean time of one create call over the first and the last 10 % of them;
- ``live_send_p50_ms`` / ``live_send_p99_ms`` / ``live_send_max_ms`` / ``live_sends``: the live
  producer's send latencies while the topics are created;
- ``first_send_after_create_s``: from the last create call's return until a send to the last
  created topic is acknowledged (the producer retries a send the broker refuses meanwhile);
- ``data_dir_bytes_per_empty_queue``: the data dir's growth (allocated blocks, as ``du``) over the
  creation, per new queue; ``broker_rss_mb``: the broker's resident memory after the creation;
- ``delete_topics_s``: the time to delete the N topics (one call each);
  ``live_send_p99_ms_delete`` / ``live_send_max_ms_delete``: the live producer's send latencies
  from the first delete call until the broker has dropped the last deleted topic.

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
    """Send to the live topic one message at a time until ``stop``; put (start, latency) of each
    send in ``out`` (ns; starts on the machine-wide monotonic clock)."""
    from gms.client import Producer

    payload = os.urandom(PAYLOAD)
    clock = time.monotonic_ns
    lat: list[tuple[int, int]] = []
    with Producer(nameserver=nameserver) as producer:
        send_until_acknowledged(producer, LIVE_TOPIC, payload, SETTLE_TIMEOUT_S)
        for _ in range(200):  # warm-up
            producer.send(LIVE_TOPIC, payload)
        ready.set()
        while not stop.is_set():
            t0 = clock()
            producer.send(LIVE_TOPIC, payload)
            lat.append((t0, clock() - t0))
    out.put(lat)


def latencies_between(sends: list[tuple[int, int]], start_ns: int, end_ns: int) -> list[int]:
    """The sorted latencies of the sends started in [start_ns, end_ns)."""
    return sorted(lat for t0, lat in sends if start_ns <= t0 < end_ns)


def wait_dropped(broker: Any, names: set[str], timeout_s: float) -> None:
    """Wait until the broker's own topic table holds none of ``names``."""
    end = time.monotonic() + timeout_s
    while names & set(broker.topics()):
        if time.monotonic() > end:
            raise TimeoutError("the broker did not drop the deleted topics")
        time.sleep(0.05)


def run(topics: int) -> dict[str, float]:
    from gms.client import Admin, Producer

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, broker_pid):
        data_dir = Path(tmp) / "data"
        admin = Admin(nameserver=nameserver)
        admin.create_topic(LIVE_TOPIC, queues=1)
        broker = Admin(admin.brokers())
        ctx = mp.get_context("spawn")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        live = ctx.Process(target=live_producer, args=(nameserver, ready, stop, out), daemon=True)
        live.start()
        if not ready.wait(SETTLE_TIMEOUT_S):
            raise TimeoutError("the live producer did not start")
        bytes_before = allocated_bytes(data_dir)
        names = [f"t{i:05d}" for i in range(topics)]
        times: list[float] = []
        create_start_ns = time.monotonic_ns()
        t_start = time.perf_counter()
        for name in names:
            t0 = time.perf_counter()
            admin.create_topic(name, queues=QUEUES)
            times.append(time.perf_counter() - t0)
        created = time.perf_counter()
        with Producer(nameserver=nameserver) as producer:
            send_until_acknowledged(producer, names[-1], os.urandom(PAYLOAD), FIRST_SEND_TIMEOUT_S)
        first_send = time.perf_counter() - created
        create_end_ns = time.monotonic_ns()
        # The creations are done: what the new (all but one empty) queues hold on disk.
        growth = allocated_bytes(data_dir) - bytes_before
        rss = rss_mb(broker_pid)
        t_delete = time.perf_counter()
        for name in names:
            admin.delete_topic(name)
        deleted = time.perf_counter()
        wait_dropped(broker, set(names), FIRST_SEND_TIMEOUT_S)
        delete_end_ns = time.monotonic_ns()
        stop.set()
        sends = out.get(timeout=SETTLE_TIMEOUT_S)
        live.join(SETTLE_TIMEOUT_S)
        lat = latencies_between(sends, create_start_ns, create_end_ns)
        lat_delete = latencies_between(sends, create_end_ns, delete_end_ns)
        tenth = max(1, topics // 10)
        broker.close()
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
            "broker_rss_mb": rss,
            "delete_topics_s": deleted - t_delete,
            "live_sends_delete": len(lat_delete),
            "live_send_p99_ms_delete": pct(lat_delete, 99) / 1e6 if lat_delete else -1,
            "live_send_max_ms_delete": lat_delete[-1] / 1e6 if lat_delete else -1,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 topics (full: 1,000)")
    parser.add_argument("--topics", type=int, help="the number of topics to create")
    args = parser.parse_args()
    topics = args.topics or (300 if args.quick else 1000)
    print(json.dumps(run(topics)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
