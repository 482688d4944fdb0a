"""Routing benchmark: one JSON line with

- ``route_lookups_per_s``: GET_ROUTE requests per second served by one ``gms-nameserver``
  process (embedded etcd), pipelined from a separate client process (target >= 20,000/s);
- ``broker_removal_s``: a broker registration running in a child process is SIGKILLed; seconds
  until it leaves the routes of a watch-fed ClusterView (target <= lease TTL + 1 s);
- ``routed_vs_direct_ratio``: produce throughput of ``bench_e2e.py``'s 100 B batch producer when
  routed through the nameserver, divided by the same producer sending straight to the broker
  (target >= 0.95).

    python benchmarks/bench_routing.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gms.broker.registration import BrokerRegistration
from gms.cluster.cluster_view import ChangeKind, ClusterView, ViewChange
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.cluster.model import BrokerInfo
from gms.net import Connection, run
from gms.protocol.codes import RequestCode

sys.path.insert(0, str(Path(__file__).parent))
from bench_e2e import _produce, _run, _start_broker
from bench_procs import start_server

TOPIC = "bench-routes"
QUEUES = 8
WINDOW = 64  # requests in flight per connection
CONNECTIONS = 2
LEASE_TTL_S = 10
START_TIMEOUT_S = 30


async def lookups(port: int, duration_s: float) -> dict[str, float]:
    conns = [await Connection.open("127.0.0.1", port) for _ in range(CONNECTIONS)]
    fields = {"topic": TOPIC}
    for _ in range(500):  # warm up both ends
        await conns[0].request(RequestCode.GET_ROUTE, fields)
    done = 0
    deadline = time.perf_counter() + duration_s

    async def worker(conn: Connection) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await conn.request(RequestCode.GET_ROUTE, fields)
            done += 1

    start_s = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns for _ in range(WINDOW)))
    elapsed_s = time.perf_counter() - start_s
    for conn in conns:
        conn.close()
    return {"requests": done, "elapsed_s": elapsed_s}


def hold_registration(nameserver: str, ttl_s: int) -> None:
    """Child: register a fake broker, say so, and live until killed."""
    info = BrokerInfo("bench-victim", "127.0.0.1:1")
    BrokerRegistration(nameserver, info, lambda assignments: None, ttl_s=ttl_s).start()
    print("registered", flush=True)
    threading.Event().wait()


async def ask(port: int, code: int, fields: dict[str, object]) -> dict[str, object]:
    conn = await Connection.open("127.0.0.1", port)
    try:
        return dict((await conn.request(code, fields)).fields)
    finally:
        conn.close()


def measure_lookups(port: int, duration_s: float) -> int:
    out = subprocess.run(
        [sys.executable, __file__, "--lookups", str(port), str(duration_s)],
        capture_output=True, text=True, check=True,
    ).stdout
    result = json.loads(out)
    return round(result["requests"] / result["elapsed_s"])


def measure_removal(port: int, client: EtcdClient) -> float:
    nameserver = f"127.0.0.1:{port}"
    gone, created = threading.Event(), threading.Event()

    def on_change(change: ViewChange) -> None:
        if change.kind is ChangeKind.BROKER_DOWN and change.name == "bench-victim":
            gone.set()
        if change.kind is ChangeKind.TOPIC_UPDATED and change.name == "bench-victim-topic":
            created.set()

    view = ClusterView(client)
    view.subscribe(on_change)
    view.start()
    child = subprocess.Popen(
        [sys.executable, __file__, "--hold", nameserver, str(LEASE_TTL_S)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline() != "registered\n":
            sys.exit("the registration child failed")
        run(ask(port, RequestCode.CREATE_TOPIC, {"topic": "bench-victim-topic", "queues": 4}))
        created.wait(START_TIMEOUT_S)
        leaders = {q.leader_address for q in view.route("bench-victim-topic").queues}
        assert "127.0.0.1:1" in leaders
        time.sleep(LEASE_TTL_S / 3 * 0.5)  # kill between two keep-alives, not right after one
        child.kill()
        killed = time.monotonic()
        if not gone.wait(LEASE_TTL_S * 3):
            sys.exit("the killed broker never left the routes")
        removal_s = time.monotonic() - killed
        leaders = {q.leader_address for q in view.route("bench-victim-topic").queues}
        assert "127.0.0.1:1" not in leaders
        return removal_s
    finally:
        child.kill()
        child.wait()
        view.stop()


def measure_routed_vs_direct(tmp: Path, nameserver: str, seconds: float) -> float:
    """One broker registered with the nameserver; the same producer direct, then routed."""
    proc, address = _start_broker(tmp / "routed", "--nameserver", nameserver)
    try:
        topic = "bench-produce"
        run(ask(int(nameserver.rsplit(":", 1)[1]), RequestCode.CREATE_TOPIC, {"topic": topic, "queues": 8}))
        _run(_produce, address, topic, 100, 1.0, nameserver=nameserver)  # warm up: queues, files
        ratios = []
        for order in ((False, True), (True, False), (False, True)):  # pairs in both orders, median
            rate = {}
            for routed in order:
                sent, elapsed = _run(_produce, address, topic, 100, seconds / 2,
                                     nameserver=nameserver if routed else None)
                rate[routed] = sent / elapsed
            ratios.append(rate[True] / rate[False])
        return statistics.median(ratios)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 s of lookups instead of 10")
    parser.add_argument("--lookups", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--hold", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lookups:
        print(json.dumps(run(lookups(int(args.lookups[0]), float(args.lookups[1])))))
        return
    if args.hold:
        hold_registration(args.hold[0], int(args.hold[1]))
        return
    with tempfile.TemporaryDirectory(prefix="gms-bench-routing-") as tmp:
        proc, port = start_server("gms.nameserver", Path(tmp), "ns", "--data-dir", str(Path(tmp) / "ns"))
        try:
            etcd = str(run(ask(port, RequestCode.REGISTER_BROKER, {}))["etcd"])
            with EtcdClient(etcd) as client:
                anchor = ClusterMetadata(client).register_broker(BrokerInfo("bench-b0", "127.0.0.1:2"))
                run(ask(port, RequestCode.CREATE_TOPIC, {"topic": TOPIC, "queues": QUEUES}))
                lookups_per_s = measure_lookups(port, 3.0 if args.quick else 10.0)
                removal_s = measure_removal(port, client)
                anchor.close()
            ratio = measure_routed_vs_direct(Path(tmp), f"127.0.0.1:{port}", 4.0 if args.quick else 10.0)
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps({
        "route_lookups_per_s": lookups_per_s,
        "route_queues": QUEUES,
        "broker_removal_s": round(removal_s, 2),
        "lease_ttl_s": LEASE_TTL_S,
        "routed_vs_direct_ratio": round(ratio, 3),
    }))


if __name__ == "__main__":
    main()
