"""Wheel smoke test: what a user gets from a non-editable ``pip install .``, run from the checkout root.

Run with the interpreter of a fresh venv that has only the built wheel installed, with the
checkout root as working directory (where a folder named like the package would shadow it):
``python .ci/smoke_wheel.py WORK_DIR``. Starts ``gms standalone`` on free ports, sends one
message, tails it, stops with Ctrl-C (SIGINT) and checks that no process is left.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

TIMEOUT_S = 60.0
DISTRIBUTION = "gms-mq"


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if result.returncode != 0:
        sys.exit(f"FAILED ({result.returncode}): {' '.join(args)}\n{result.stdout}{result.stderr}")
    return result.stdout


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def check_distribution_name(work: Path) -> None:
    """The wheel is the gms-mq distribution (PyPI's `gms` is an unrelated project), and that is what
    provides the installed ``gms`` package."""
    (wheel,) = (work / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as zipped:
        metadata = next(name for name in zipped.namelist() if name.endswith(".dist-info/METADATA"))
        name = re.search(r"^Name: (.+)$", zipped.read(metadata).decode(), re.MULTILINE)
    if name is None or name.group(1).strip() != DISTRIBUTION:
        sys.exit(f"FAILED: {wheel.name} is named {name and name.group(1)!r}, not {DISTRIBUTION!r}")
    providers = importlib.metadata.packages_distributions().get("gms")
    if providers is None or set(providers) != {DISTRIBUTION}:
        sys.exit(f"FAILED: the installed gms package comes from {providers}, not {DISTRIBUTION!r} alone")


def main() -> None:
    work = Path(sys.argv[1])
    data_dir = work / "standalone-data"
    check_distribution_name(work)
    run(sys.executable, "-c", "import gms.client, gms.broker, gms.nameserver, gms.cli")
    run(sys.executable, "-m", "gms.broker", "--help")
    run(sys.executable, "-m", "gms.nameserver", "--help")
    run(bin_path("gms"), "--version")
    standalone = subprocess.Popen(
        [bin_path("gms"), "standalone", "--data-dir", str(data_dir), "--nameserver-port", "0",
         "--broker-port", "0", "--nameserver-metrics-port", "0", "--broker-metrics-port", "0",
         "--console-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = ""
        deadline = time.monotonic() + TIMEOUT_S
        assert standalone.stdout is not None
        while "broker" not in banner and time.monotonic() < deadline:
            line = standalone.stdout.readline()
            if not line:
                sys.exit(f"FAILED: gms standalone exited ({standalone.wait()}):\n{banner}")
            banner += line
        match = re.search(r"nameserver\s+(\S+)", banner)
        if match is None:
            sys.exit(f"FAILED: no nameserver address in the standalone banner:\n{banner}")
        nameserver = match.group(1)
        run(bin_path("gms"), "topic", "create", "smoke", "--queues", "1", "--nameserver", nameserver)
        run(bin_path("gms"), "produce", "smoke", "hello from the wheel", "--nameserver", nameserver)
        tailed = run(bin_path("gms"), "tail", "smoke", "--from", "first", "--count", "1", "--nameserver", nameserver)
        if "hello from the wheel" not in tailed:
            sys.exit(f"FAILED: gms tail did not print the message:\n{tailed}")
    finally:
        standalone.send_signal(signal.SIGINT)
        try:
            code = standalone.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            standalone.kill()
            sys.exit("FAILED: gms standalone did not stop on Ctrl-C")
    time.sleep(0.5)
    left = processes_mentioning(str(data_dir))
    if left:
        sys.exit(f"FAILED: processes left after Ctrl-C: {left}")
    print(f"wheel smoke test passed (standalone exit code {code}, nameserver {nameserver})")


if __name__ == "__main__":
    main()
