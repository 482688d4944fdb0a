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
