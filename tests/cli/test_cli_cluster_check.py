"""`gms cluster --check` for scripts and container health checks: `ok` and exit 0, or the problems
one per line and exit 1, also when no nameserver answers (then plain `gms cluster` exits 1 with a
message too, never a traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gms_cluster import LocalCluster
from processes import free_port

pytestmark = pytest.mark.timeout(60)


def gms_cluster(nameserver: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "cluster", "--nameserver", nameserver, *args],
                            capture_output=True, text=True, timeout=30, check=False)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_check_says_ok_or_lists_the_problems(tmp_path):
    cluster = LocalCluster(tmp_path).start(nameservers=1, brokers=0)
    try:
        empty = gms_cluster(cluster.nameserver, "--check")
        assert empty.returncode == 1
        assert empty.stdout.splitlines() == ["no broker is registered: start one with `gms-broker --nameserver ...`"]
        cluster.add_broker()
        cluster.wait_registered(1)
        healthy = gms_cluster(cluster.nameserver, "--check")
        assert (healthy.returncode, healthy.stdout, healthy.stderr) == (0, "ok\n", "")
        cluster.nameservers[0].pause()  # a hung nameserver: the check gives up after the request timeout
        try:
            hung = gms_cluster(cluster.nameserver, "--check")
        finally:
            cluster.nameservers[0].resume()
        assert hung.returncode == 1
        [problem] = hung.stdout.splitlines()
        assert problem.startswith("no nameserver answers: ")
    finally:
        cluster.stop()


def test_an_unreachable_nameserver_is_exit_1_with_a_message():
    nowhere = f"127.0.0.1:{free_port()}"
    checked = gms_cluster(nowhere, "--check")
    assert checked.returncode == 1
    [problem] = checked.stdout.splitlines()
    assert problem.startswith(f"no nameserver answers: {nowhere}: cannot connect")
    plain = gms_cluster(nowhere)
    assert plain.returncode == 1
    assert plain.stderr.startswith(f"Error: no nameserver at {nowhere}")
