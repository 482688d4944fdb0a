"""`gms-nameserver` as a real process: embedded etcd started under the data dir, served, and
gone with the nameserver on SIGINT; usage errors say what to do."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from processes import alive, descendants, wait_until
from test_server_helpers import Rpc

from gms.net import LoopThread
from gms.protocol.codes import RequestCode as C

START_TIMEOUT_S = 20


def test_embedded_etcd_lives_and_dies_with_the_nameserver(tmp_path):
    port_file = tmp_path / "ns.port"
    with open(tmp_path / "ns.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gms.nameserver", "--listen", "127.0.0.1:0",
             "--data-dir", str(tmp_path / "data"), "--port-file", str(port_file)],
            stdout=log, stderr=subprocess.STDOUT,
        )
    loop = LoopThread()
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, START_TIMEOUT_S)
        assert proc.poll() is None, (tmp_path / "ns.log").read_text()
        children = descendants(proc.pid)
        assert children, "the embedded etcd child is missing"
        assert (tmp_path / "data" / "etcd" / "member-data").is_dir()
        rpc = Rpc(loop, int(port_file.read_text()))
        status = rpc.call(C.CLUSTER_STATUS)
        assert status["etcd"]["healthy"] is True
        assert status["nameservers"][0]["address"].endswith(f":{port_file.read_text()}")
        rpc.close()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in children), "a child outlived the nameserver"
        assert "nameserver stopped cleanly" in (tmp_path / "ns.log").read_text()
    finally:
        loop.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_options_are_usage_errors(tmp_path):
    for args, message in [
        (["--etcd", "nohost"], "is not host:port"),
        (["--listen", "127.0.0.1:99999"], "is not host:port"),
    ]:
        result = subprocess.run(
            [sys.executable, "-P", "-m", "gms.nameserver", "--data-dir", str(tmp_path), *args],
            check=False, capture_output=True, text=True, timeout=30,
        )
        assert result.returncode == 2
        assert message in result.stderr and "Traceback" not in result.stderr
