"""The embedded etcd child comes up healthy and never outlives its owner."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gms.cluster.errors import EmbeddedEtcdError
from gms.cluster.etcd_client import EtcdClient
from gms.nameserver.embedded_etcd import EmbeddedEtcd


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped or marked Z.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_start_stop_leaves_no_process(tmp_path):
    with EmbeddedEtcd(tmp_path) as etcd:
        pid = etcd.pid
        assert pid is not None and alive(pid)
        with EtcdClient(etcd.endpoint) as client:
            client.put("/k", b"v")
            assert client.get("/k").value == b"v"
        assert os.getpgid(pid) == pid  # own process group
    assert not alive(pid)
    assert (tmp_path / "etcd.log").stat().st_size > 0


def test_port_in_use_is_refused(tmp_path):
    with EmbeddedEtcd(tmp_path / "a") as first:
        port = int(first.endpoint.rpartition(":")[2])
        with pytest.raises(EmbeddedEtcdError, match=f"{port} for etcd is already in use"):
            EmbeddedEtcd(tmp_path / "b", client_port=port).start()


def test_start_failure_reports_log_tail(tmp_path):
    (tmp_path / "member-data").write_text("not a directory")
    etcd = EmbeddedEtcd(tmp_path)
    with pytest.raises(EmbeddedEtcdError, match="exited with code .* log tail"):
        etcd.start()
    assert etcd.pid is None


def test_sigkilled_parent_takes_etcd_with_it(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time
        from gms.nameserver.embedded_etcd import EmbeddedEtcd
        etcd = EmbeddedEtcd({str(tmp_path)!r}).start()
        print(etcd.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-P", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert alive(child_pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    deadline = time.monotonic() + 5
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(child_pid)
