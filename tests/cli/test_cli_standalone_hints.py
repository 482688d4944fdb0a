"""`gms standalone` says what is wrong in its own words, as real processes: a secured data dir
started without --secure, a port in use, and the read-only console's note name this command's
flags (--secure, --nameserver-port, --console-admin), not those of the servers it runs."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from processes import FREE_MONITORING_PORTS

pytestmark = pytest.mark.timeout(240)
START_TIMEOUT_S = 90
RUN_TIMEOUT_S = 60


def standalone_args(data: Path, *more: str) -> list[str]:
    return [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data), "--nameserver-port", "0",
            "--broker-port", "0", *FREE_MONITORING_PORTS, "--commitlog-file-size", str(16 << 20), *more]


def run_banner(args: list[str], last: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``args`` and read its banner up to the line starting with ``last``."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    banner = ""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not re.search(rf"^\s*{last}\s", banner, re.MULTILINE) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        banner += line
    return proc, banner


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    return out


def post(url: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=b'{"topic": "t"}', method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_secured_data_dir_without_secure_and_the_read_only_console_name_the_flags(tmp_path):
    data = tmp_path / "data"
    proc, banner = run_banner(standalone_args(data, "--secure"), "clients")
    try:
        console = re.search(r"console\s+(http://\S+/)", banner)
        assert console, banner
        assert "(read-only; --console-admin for admin actions)" in banner
        with urllib.request.urlopen(console.group(1) + "api/config", timeout=10) as answer:
            assert json.loads(answer.read())["admin_how"] == "gms standalone --console-admin"
        status, refused = post(console.group(1) + "api/topics")
        assert status == 403 and "gms standalone --console-admin" in json.dumps(refused), refused
    finally:
        stop(proc)

    # Without --secure: said at once, before etcd or a server starts (it was "nameserver exited
    # with code 1" once the nameserver gave up on etcd, ~20 s later).
    logs_before = sorted(p.name for p in (data / "logs").iterdir())
    again = subprocess.run(standalone_args(data), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                           check=False)
    assert again.returncode == 1
    assert f"the data dir {data} is secured" in again.stdout and "add --secure" in again.stdout, again.stdout
    assert "exited with code" not in again.stdout
    assert sorted(p.name for p in (data / "logs").iterdir()) == logs_before  # no server was started


def test_a_port_in_use_names_the_standalone_flag(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        args = standalone_args(tmp_path / "data")
        args[args.index("--nameserver-port") + 1] = str(busy)
        failed = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert failed.returncode == 1
    assert f"cannot listen on 127.0.0.1:{busy}" in failed.stdout, failed.stdout
    assert "pick another port with --nameserver-port" in failed.stdout
    assert "--listen" not in failed.stdout and "--metrics-listen" not in failed.stdout


def controller_epoch(nameserver: str) -> int:
    """The acting controller's epoch as `gms cluster` shows it, once there is one."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        status = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "cluster", "--json", "-n", nameserver],
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        epoch = json.loads(status.stdout)["controller"].get("epoch") if status.stdout else None
        if epoch:
            return int(epoch)
        time.sleep(0.2)
    pytest.fail("no controller was elected")


def test_the_controller_epoch_is_etcds_revision_as_docs_replication_says(tmp_path):
    """docs/replication.md: 3 on a fresh standalone (etcd's revision after the nameserver's
    registration and election key), then larger after a restart, by the writes in between."""
    epochs = []
    for _ in range(2):
        proc, banner = run_banner(standalone_args(tmp_path / "data", "--no-console", "--no-rocketmq"), "data")
        try:
            nameserver = re.search(r"nameserver\s+(\S+)", banner)
            assert nameserver, banner
            epochs.append(controller_epoch(nameserver.group(1)))
        finally:
            assert "Traceback" not in stop(proc)
    assert epochs[0] == 3 and epochs[1] > epochs[0] + 1, epochs
