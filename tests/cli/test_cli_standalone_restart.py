"""`gms standalone` restarted on its data dir: the broker store's recorded layout wins, so
`--commitlog-file-size` need not be repeated; a different size is refused in standalone's own
terms; etcd comes back on the same port."""

from __future__ import annotations

import signal
import subprocess
import sys

from processes import FREE_MONITORING_PORTS
from test_cli_standalone import read_addresses, wait_broker_registered

SIZE_BYTES = 8 << 20  # not the 1 GiB default


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
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
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
