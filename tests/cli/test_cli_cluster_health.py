"""`gms cluster` as a health check: exit 1 with the reason when no broker is registered, when
a queue has no live leader and when a queue's ISR is below its minimum; exit 0 when healthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gms_cluster import LocalCluster

from gms.client import Admin

BROKER_TOML = """
[broker]
lease_ttl_s = 2
replica_lag_time_max_ms = 1500
replica_fetch_wait_ms = 200
"""
TIMEOUT_S = 30


def gms_cluster(nameserver: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "cluster", *args],
                            env={**os.environ, "GMS_NAMESERVER": nameserver},
                            capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def wait_problems(nameserver: str, *needles: str) -> list[str]:
    """Poll `gms cluster --json` until its problems mention every needle."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        problems = json.loads(gms_cluster(nameserver, "--json").stdout)["problems"]
        if all(any(n in p for p in problems) for n in needles):
            return problems
        assert time.monotonic() < deadline, f"problems {problems} never mentioned {needles}"
        time.sleep(0.3)


def test_cluster_exits_nonzero_naming_the_reason(tmp_path):
    cluster = LocalCluster(tmp_path).start(nameservers=1, brokers=0)
    try:
        empty = gms_cluster(cluster.nameserver)
        assert empty.returncode == 1 and "no broker is registered" in empty.stderr

        config = tmp_path / "broker.toml"
        config.write_text(BROKER_TOML)
        for _ in range(2):
            cluster.add_broker("--config", str(config))
        cluster.wait_registered(2)
        with Admin(nameserver=cluster.nameserver) as admin:
            admin.create_topic("replicated", queues=2, replicas=2)  # min ISR 2
            admin.create_topic("single", queues=2)  # one queue on each broker
        healthy = gms_cluster(cluster.nameserver)
        assert healthy.returncode == 0, healthy.stderr

        cluster.brokers[1].kill()
        wait_problems(cluster.nameserver, "without a live leader", "fewer in-sync replicas")
        sick = gms_cluster(cluster.nameserver)
        assert sick.returncode == 1
        assert "1 queue(s) without a live leader (sends fail): single/" in sick.stderr
        assert "2 queue(s) with fewer in-sync replicas than their minimum" in sick.stderr
        assert "replicated/0" in sick.stderr and "replicated/1" in sick.stderr

        cluster.brokers[0].kill()
        wait_problems(cluster.nameserver, "no broker is registered")
        none = gms_cluster(cluster.nameserver)
        assert none.returncode == 1 and "no broker is registered" in none.stderr
    finally:
        cluster.stop()
