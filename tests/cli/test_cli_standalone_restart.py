"""`gms standalone` restarted on its data dir: the broker store's recorded layout wins, so
`--commitlog-file-size` need not be repeated; a different size is refused in standalone's own
terms; etcd comes back on the same port; the broker comes back as itself on another port."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from processes import FREE_MONITORING_PORTS
from test_cli_standalone import gms, read_addresses, wait_broker_registered

from gms.nameserver.embedded_etcd import free_port

SIZE_BYTES = 8 << 20  # not the default
HEALTHY_TIMEOUT_S = 30


def standalone(data_dir, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data_dir),
         "--nameserver-port", "0", "--broker-port", "0", *FREE_MONITORING_PORTS, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def run_once(data_dir, *args: str) -> dict[str, str]:
    """Start, wait for the broker to register, stop with SIGINT; the banner's addresses."""
    proc = standalone(data_dir, *args)
    try:
        addresses = read_addresses(proc)
        assert wait_broker_registered(addresses["nameserver"]), "the broker did not register"
    finally:
        stop(proc)
    return addresses


def test_restart_without_commitlog_file_size(tmp_path):
    data = tmp_path / "data"
    first = run_once(data, "--commitlog-file-size", str(SIZE_BYTES))
    commitlog = data / "broker" / "store" / "commitlog"
    assert {f.stat().st_size for f in commitlog.iterdir()} == {SIZE_BYTES}

    second = run_once(data)  # no --commitlog-file-size: the stored layout is used
    assert second["etcd"] == first["etcd"]  # etcd keeps its port across restarts
    assert {f.stat().st_size for f in commitlog.iterdir()} == {SIZE_BYTES}

    proc = standalone(data, "--commitlog-file-size", str(2 * SIZE_BYTES))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"created with --commitlog-file-size {SIZE_BYTES}, not {2 * SIZE_BYTES}" in out
    assert "Leave out --commitlog-file-size" in out and "Traceback" not in out


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def healthy_cluster(nameserver: str) -> dict:
    """`gms cluster --json` once it has no problems (a restarted broker's queues get their
    leader as its registration is seen); the last answer if that does not come."""
    deadline = time.monotonic() + HEALTHY_TIMEOUT_S
    while True:
        status = json.loads(gms(nameserver, "cluster", "--json").stdout)
        if status["healthy"] or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def test_restart_on_another_broker_port_keeps_the_broker_and_its_topics(tmp_path):
    """The broker's identity lives in its store: on another port it is the same broker, its
    topics keep their leader (advertised at the new address), and its messages are served."""
    data = tmp_path / "data"
    proc = standalone(data, "--commitlog-file-size", str(SIZE_BYTES))
    try:
        first = read_addresses(proc)
        assert wait_broker_registered(first["nameserver"]), "the broker did not register"
        assert gms(first["nameserver"], "topic", "create", "orders", "--queues", "1").returncode == 0
        sent = gms(first["nameserver"], "produce", "orders", input=b"before\n")
        assert sent.returncode == 0, sent.stderr
        [before] = healthy_cluster(first["nameserver"])["brokers"]
    finally:
        stop(proc)

    port = free_port(avoid=int(first["broker"].rsplit(":", 1)[1]))
    proc = standalone(data, "--broker-port", str(port))  # the last --broker-port given wins
    try:
        second = read_addresses(proc)
        nameserver = second["nameserver"]
        assert second["broker"] == f"127.0.0.1:{port}" != first["broker"]
        status = healthy_cluster(nameserver)
        assert status["problems"] == [], status["problems"]
        [after] = status["brokers"]
        assert after["address"] == second["broker"]
        assert after["broker_id"] == before["broker_id"]
        sent = gms(nameserver, "produce", "orders", input=b"after\n")
        assert sent.returncode == 0, sent.stderr
        tailed = gms(nameserver, "tail", "orders", "--from", "first", "--count", "2")
        assert tailed.returncode == 0, tailed.stderr
        assert [line.split(b"  ")[-1] for line in tailed.stdout.splitlines()] == [b"before", b"after"]
    finally:
        stop(proc)
