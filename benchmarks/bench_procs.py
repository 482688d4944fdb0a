"""Start gms server processes for the benchmarks: ephemeral port, wait for the port file,
fail with the tail of the process's log."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 30


def start_server(module: str, root: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``python -m module --listen 127.0.0.1:0 ARGS`` logging to ``root/name.log``; (process, port)."""
    port_file, log = root / f"{name}.port", root / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", module, "--listen", "127.0.0.1:0", "--log-level", "warning", *args,
             "--port-file", str(port_file)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not port_file.exists():  # written atomically once the server listens
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"{module} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def stop_servers(procs: list[subprocess.Popen[bytes]], timeout_s: float = 15) -> None:
    """SIGTERM every server still running, then wait for each (SIGKILL after ``timeout_s``)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_cluster(root: Path, procs: list[subprocess.Popen[bytes]], broker_toml: str,
                  brokers: int = 3) -> tuple[str, dict[str, subprocess.Popen[bytes]]]:
    """A nameserver (embedded etcd) and ``brokers`` brokers configured by ``broker_toml``; every
    process is appended to ``procs`` as it starts (stop them with :func:`stop_servers`).
    Returns the nameserver address and the brokers by address."""
    ns, ns_port = start_server("gms.nameserver", root, "ns", "--data-dir", str(root / "ns"))
    procs.append(ns)
    nameserver = f"127.0.0.1:{ns_port}"
    by_address: dict[str, subprocess.Popen[bytes]] = {}
    for i in range(brokers):
        config = root / f"b{i}.toml"
        config.write_text(broker_toml)
        proc, port = start_server("gms.broker", root, f"b{i}", "--store-dir", str(root / f"b{i}"),
                                  "--nameserver", nameserver, "--config", str(config))
        procs.append(proc)
        by_address[f"127.0.0.1:{port}"] = proc
    return nameserver, by_address
