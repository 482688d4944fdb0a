"""`gms standalone` as a real process on ephemeral ports: used by `gms produce` and `gms tail`,
then stopped with SIGINT leaving no child process behind (checked in /proc)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from file_modes import modes, not_private, umask
from processes import FREE_MONITORING_PORTS, alive, descendants, processes_mentioning, wait_until
from scrape import get, scrape

START_TIMEOUT_S = 40
REGISTER_TIMEOUT_S = 15


def read_addresses(proc: subprocess.Popen[str]) -> dict[str, str]:
    """The banner's addresses: {"nameserver": "host:port", "broker": ..., "etcd": ...}."""
    addresses: dict[str, str] = {}
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    while "etcd" not in addresses:
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            pytest.fail("gms standalone did not print its addresses")
        name, _, address = line.strip().partition(" ")
        if name in ("nameserver", "broker", "etcd", "metrics", "console", "rocketmq", "kafka"):
            addresses[name] = address.strip()
    return addresses


def running_standalone(data_dir: Path) -> Iterator[dict[str, str]]:
    """Yield the banner's addresses of a `gms standalone` on ephemeral ports (the broker
    registered; ``rocketmq`` and ``kafka`` as bare host:port), stopped with SIGINT after."""
    from gms.client import Admin

    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data_dir),
         "--nameserver-port", "0", "--broker-port", "0", "--no-console", *FREE_MONITORING_PORTS,
         "--commitlog-file-size", str(32 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = read_addresses(proc)
        for endpoint in ("rocketmq", "kafka"):
            banner[endpoint] = banner[endpoint].split()[0]
        with Admin(nameserver=banner["nameserver"]) as admin:
            wait_until(lambda: bool(admin.cluster_status()["brokers"]), 15)
        yield banner
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def gms(nameserver: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args, "--nameserver", nameserver], input=input,
                          capture_output=True, timeout=60, check=False)


def wait_broker_registered(nameserver: str) -> bool:
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while time.monotonic() < deadline:
        status = gms(nameserver, "cluster", "--json")
        if status.stdout and json.loads(status.stdout)["brokers"]:
            return True
        time.sleep(0.3)
    return False


def test_standalone_serves_produce_and_tail_then_stops_on_sigint(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(tmp_path / "data"),
         "--nameserver-port", "0", "--broker-port", "0", *FREE_MONITORING_PORTS,
         "--commitlog-file-size", str(32 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    registered = False
    try:
        addresses = read_addresses(proc)
        nameserver = addresses["nameserver"]
        tree = descendants(proc.pid)
        assert len(tree) >= 4, "etcd, nameserver, broker and console run as children"
        registered = wait_broker_registered(nameserver)
        if registered:
            nameserver_metrics, broker_metrics = (int(p) for p in re.findall(r":(\d+)/metrics", addresses["metrics"]))
            assert wait_until(lambda: get(nameserver_metrics, "/readyz") == (200, "ready\n"), 10)
            assert wait_until(lambda: get(broker_metrics, "/readyz") == (200, "ready\n"), 10)
            assert scrape(nameserver_metrics)["gms_nameserver_brokers", ()] == 1
            assert scrape(broker_metrics)["gms_broker_up_seconds", ()] > 0
            console = int(re.search(r":(\d+)/", addresses["console"]).group(1))
            status, page = get(console, "/")
            assert status == 200 and "<html" in page.lower()
            assert gms(nameserver, "topic", "create", "hello", "--queues", "2").returncode == 0
            sent = gms(nameserver, "produce", "hello", "--tag", "greeting", input=b"hi there\nsecond\n")
            assert sent.returncode == 0, sent.stderr
            tailed = gms(nameserver, "tail", "hello", "--count", "2")
            assert tailed.returncode == 0, tailed.stderr
            assert sorted(line.split(b"  ")[-1] for line in tailed.stdout.splitlines()) == [b"hi there", b"second"]

        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "gms standalone stopped" in out and "Traceback" not in out
        assert not [pid for pid in tree if alive(pid)], "a child outlived gms standalone"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if not registered:
        pytest.skip("started and stopped cleanly, but the broker never registered with the nameserver"
                    " (gms-broker --nameserver not wired yet): produce/tail not exercised")


def run_standalone_briefly(data_dir: Path) -> None:
    """Start ``gms standalone`` on ``data_dir``, wait for its banner, stop it with SIGINT."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data_dir),
         "--nameserver-port", "0", "--broker-port", "0", *FREE_MONITORING_PORTS,
         "--commitlog-file-size", str(32 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        read_addresses(proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_standalone_data_dir_and_logs_are_private_whatever_the_umask(tmp_path):
    """The logs hold audit lines (user names, client addresses): like the stores, they are 0600 in
    0700 directories, and logs an older version left readable are tightened at start."""
    data_dir = tmp_path / "data"
    with umask(0):
        run_standalone_briefly(data_dir)
    found = modes(data_dir)
    assert {"./", "logs/", "logs/broker.log", "logs/nameserver.log", "logs/broker.port", "etcd/"} <= set(found)
    assert not_private(data_dir) == {}

    logs = data_dir / "logs"
    logs.chmod(0o775)  # as an older version left them
    for log in logs.iterdir():
        log.chmod(0o664)
    with umask(0):
        run_standalone_briefly(data_dir)
    assert not_private(data_dir) == {}


def without_the_rocketmq_extra(tmp_path: Path) -> dict[str, str]:
    """An environment whose processes (the standalone and its children) lack the ``rocketmq``
    extra: a sitecustomize first on the path marks the package absent, which Python reports as it
    does a package that is not installed (``find_spec`` None, ``import`` ImportError)."""
    shadow = tmp_path / "no-rocketmq-extra"
    shadow.mkdir()
    (shadow / "sitecustomize.py").write_text('import sys\n\nsys.modules["rocketmq"] = None\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))}
    probe = subprocess.run([sys.executable, "-P", "-c", "import rocketmq"], env=env, capture_output=True, check=False)
    assert probe.returncode != 0 and b"ModuleNotFoundError" in probe.stderr
    return env


def standalone_until_rocketmq_line(data_dir: Path, env: dict[str, str], *args: str) -> tuple[str, bool]:
    """Start ``gms standalone`` and read its output up to the banner's ``rocketmq`` line or its exit:
    (the output, whether it is still running -- then stopped with SIGINT)."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data_dir), "--nameserver-port", "0",
         "--broker-port", "0", "--nameserver-metrics-port", "0", "--broker-metrics-port", "0", "--no-console",
         "--kafka-port", "0", "--commitlog-file-size", str(32 << 20), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    out = ""
    try:
        assert proc.stdout is not None
        banner = False
        for line in proc.stdout:
            out += line
            if line.strip().startswith("rocketmq"):
                banner = True
                break
        if not banner:  # its output ended: it is exiting (poll() may not know yet)
            proc.wait(timeout=30)
        running = proc.poll() is None
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        return out + rest, running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_rocketmq_port_asked_for_without_the_extra_is_an_error(tmp_path):
    env = without_the_rocketmq_extra(tmp_path)
    out, running = standalone_until_rocketmq_line(tmp_path / "asked", env, "--rocketmq-port", "0")
    assert not running, f"gms standalone ran on without the RocketMQ API it was asked for:\n{out}"
    assert "--rocketmq-port 0: serving the RocketMQ 5 API needs the rocketmq extra: pip install '.[rocketmq]'" in out
    assert processes_mentioning(str(tmp_path / "asked")) == []  # refused before anything started

    # Not asked for (the default port): the banner notes what to install, and the rest runs.
    out, running = standalone_until_rocketmq_line(tmp_path / "default", env)
    assert running, out
    assert "rocketmq    not served: it needs the rocketmq extra: pip install '.[rocketmq]'" in out
