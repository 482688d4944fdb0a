"""Rebalance benchmark: a nameserver and 3 brokers on this machine; consumers of one group
(the public SDK, ``Consumer(nameserver=...)``, each polling on its own thread) join one by one,
then leave one by one. One JSON line with

- ``heartbeat_interval_ms``: the coordinator's interval for a settled group (a third of the
  brokers' member expiry, at most 3 s); a join or leave should complete within one of these
  plus the hand-off (the old owner's commit and release);
- ``join_rebalance_ms_p50`` / ``_max``: from a new consumer's constructor call until every queue
  is owned by exactly one member and members' counts differ by at most one;
- ``leave_rebalance_ms_p50`` / ``_max``: from a consumer's ``close()`` until the same.

    python benchmarks/bench_rebalance.py [--quick] [--member-expiry-ms 30000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from gms.broker.groups import heartbeat_interval_ms
from gms.client import Admin, Consumer

sys.path.insert(0, str(Path(__file__).parent))
from bench_procs import start_cluster, stop_servers

TOPIC = "bench-rebalance"
QUEUES = 12
SETTLE_TIMEOUT_S = 60
SAMPLE_INTERVAL_S = 0.005


class Member:
    """A consumer polling on its own thread (rebalance callbacks and releases run in ``poll``)."""

    def __init__(self, nameserver: str, group: str) -> None:
        self.consumer = Consumer(nameserver=nameserver, group=group, subscription={TOPIC: "*"})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(20)
        self.consumer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def settled(members: list[Member]) -> bool:
    owned = [m.consumer.assignment() for m in members]
    claimed = Counter(q.queue_id for queues in owned for q in queues)
    counts = [len(queues) for queues in owned]
    return (sorted(claimed) == list(range(QUEUES)) and set(claimed.values()) == {1}
            and max(counts) - min(counts) <= 1)


def wait_settled(members: list[Member], started: float) -> float:
    """Milliseconds from ``started`` until the group settled."""
    while not settled(members):
        if time.monotonic() - started > SETTLE_TIMEOUT_S:
            sys.exit(f"the group did not settle within {SETTLE_TIMEOUT_S} s")
        time.sleep(SAMPLE_INTERVAL_S)
    return (time.monotonic() - started) * 1000


def measure(nameserver: str, members_max: int, cycles: int, interval_s: float) -> dict[str, float]:
    """Joins and leaves, each after a random pause of up to one heartbeat interval (so they land
    at every phase of the members' heartbeats, not right after one)."""
    with Admin(nameserver=nameserver) as admin:
        while len(admin.brokers()) < 3:
            time.sleep(0.1)
        admin.create_topic(TOPIC, QUEUES)
    joins: list[float] = []  # a member joining a group that has members (a hand-off)
    leaves: list[float] = []
    members: list[Member] = []
    try:
        for cycle in range(cycles):
            members.append(Member(nameserver, f"bench-{cycle}"))
            while len(members) < members_max:
                time.sleep(random.uniform(0, interval_s))
                started = time.monotonic()
                members.append(Member(nameserver, f"bench-{cycle}"))
                joins.append(wait_settled(members, started))
            while len(members) > 1:
                leaving = members.pop(0)
                time.sleep(random.uniform(0, interval_s))
                started = time.monotonic()
                leaving.close()
                leaves.append(wait_settled(members, started))
            members.pop().close()
    finally:
        for member in members:
            member.close()
    return {
        "join_rebalance_ms_p50": round(statistics.median(joins), 1),
        "join_rebalance_ms_max": round(max(joins), 1),
        "leave_rebalance_ms_p50": round(statistics.median(leaves), 1),
        "leave_rebalance_ms_max": round(max(leaves), 1),
        "joins": len(joins), "leaves": len(leaves),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one join/leave cycle of 3 members")
    parser.add_argument("--member-expiry-ms", type=int, default=30_000, help="the brokers' member expiry")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gms-bench-rebalance-") as tmp:
        root = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            nameserver, _ = start_cluster(root, procs, f"[broker]\nmember_expiry_ms = {args.member_expiry_ms}\n"
                                                       "[store]\ncommitlog_file_size_bytes = 67108864\n")
            interval_s = heartbeat_interval_ms(args.member_expiry_ms) / 1000
            result = measure(nameserver, 3 if args.quick else 5, 1 if args.quick else 3, interval_s)
        finally:
            stop_servers(procs)
    print(json.dumps({"heartbeat_interval_ms": heartbeat_interval_ms(args.member_expiry_ms),
                      "member_expiry_ms": args.member_expiry_ms, **result}))


if __name__ == "__main__":
    main()
