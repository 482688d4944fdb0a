"""`run_standalone`: etcd + nameserver + broker start, answer, and all stop on SIGINT/SIGTERM
leaving no process behind; a part that cannot start takes the others down with a clear error."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest
from processes import alive, descendants, processes_mentioning
from test_server_helpers import Rpc

from gms.net import LoopThread
from gms.protocol.codes import RequestCode as C

SCRIPT = """
import sys
from pathlib import Path
from gms.cli.standalone import StandaloneOptions, run_standalone
sys.exit(run_standalone(StandaloneOptions(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                          nameserver_metrics_port=0, broker_metrics_port=0, console_port=None,
                                          rocketmq_port=None, kafka_port=None, commitlog_file_size_bytes=32 << 20)))
"""
START_TIMEOUT_S = 40


def start(data_dir, nameserver_port=0, broker_port=0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-P", "-c", SCRIPT, str(data_dir), str(nameserver_port), str(broker_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def read_banner(proc: subprocess.Popen) -> dict[str, str]:
    """The printed addresses: {"nameserver": "host:port", "broker": ..., "etcd": ...}."""
    addresses: dict[str, str] = {}
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while "etcd" not in addresses and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("standalone exited before printing its addresses")
        name, _, address = line.strip().partition(" ")
        if name in ("nameserver", "broker", "etcd"):
            addresses[name] = address.strip()
    return addresses


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_starts_answers_and_stops_leaving_nothing(tmp_path, sig):
    proc = start(tmp_path / "data")
    loop = LoopThread()
    try:
        addresses = read_banner(proc)
        tree = descendants(proc.pid)
        assert len(tree) >= 3  # etcd, nameserver, broker
        rpc = Rpc(loop, int(addresses["nameserver"].rpartition(":")[2]))
        status = rpc.call(C.CLUSTER_STATUS)
        assert status["etcd"] == {"endpoints": addresses["etcd"], "healthy": True, "version": "3.5.1"}
        assert [n["address"] for n in status["nameservers"]] == [addresses["nameserver"]]
        rpc.close()
        broker = Rpc(loop, int(addresses["broker"].rpartition(":")[2]))
        assert broker.call(C.PING) == {}
        broker.close()

        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "gms standalone stopped" in out
        assert not [pid for pid in tree if alive(pid)], "a child outlived gms standalone"
        assert processes_mentioning(str(tmp_path)) == []
        logs = tmp_path / "data" / "logs"
        assert "broker stopped cleanly" in (logs / "broker.log").read_text()
        assert "nameserver stopped cleanly" in (logs / "nameserver.log").read_text()
    finally:
        loop.stop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_busy_broker_port_fails_cleanly(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = start(tmp_path / "data", broker_port=busy.getsockname()[1])
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    # Found before anything starts, and named by standalone's own flag.
    assert "cannot listen on" in out and "--broker-port" in out and "stopping the rest" not in out
    assert processes_mentioning(str(tmp_path)) == []  # etcd and nameserver stopped too
