"""The embedded etcd child comes up healthy and never outlives its owner."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from gms.cluster.errors import EmbeddedEtcdError
from gms.cluster.etcd_client import EtcdClient
from gms.nameserver import embedded_etcd
from gms.nameserver.embedded_etcd import EmbeddedEtcd, etcd_hosts


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
        with pytest.raises(EmbeddedEtcdError, match=f"etcd client port 127.0.0.1:{port} is already in use"):
            EmbeddedEtcd(tmp_path / "b", client_port=port).start()


def test_restart_keeps_ports_and_data(tmp_path):
    with EmbeddedEtcd(tmp_path) as first:
        endpoint = first.endpoint
        with EtcdClient(endpoint) as client:
            client.put("/k", b"kept")
    ports = (tmp_path / "ports.json").read_text()
    with EmbeddedEtcd(tmp_path) as second:
        assert second.endpoint == endpoint  # brokers holding the endpoint find etcd again
        with EtcdClient(second.endpoint) as client:
            assert client.get("/k").value == b"kept"
    assert (tmp_path / "ports.json").read_text() == ports


def test_remembered_port_taken_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded_etcd, "PORT_FREE_WAIT_S", 0.2)
    with EmbeddedEtcd(tmp_path / "a") as first:
        port = int(first.endpoint.rpartition(":")[2])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ports.json").write_text(f'{{"client_port": {port}, "peer_port": 0}}')
    taken = f"port 127.0.0.1:{port} is already in use.*delete .*ports.json"
    with EmbeddedEtcd(tmp_path / "a"), pytest.raises(EmbeddedEtcdError, match=taken):  # a holds b's port
        EmbeddedEtcd(tmp_path / "b").start()


def test_free_ports_are_picked_at_random_below_the_ephemeral_range_that_outgoing_connections_use():
    floor = int(embedded_etcd.EPHEMERAL_RANGE_FILE.read_text().split()[0])
    avoid = floor - 1
    picks = {embedded_etcd.free_port("127.0.0.1", avoid=avoid) for _ in range(50)}
    assert all(floor - embedded_etcd.FREE_PORT_SPAN <= port < floor for port in picks)
    assert avoid not in picks
    assert len(picks) > 1  # not the one port the OS just handed out, again and again


def test_a_picked_port_taken_before_etcd_binds_it_is_picked_again(tmp_path, monkeypatch):
    """Another process can bind a port between our pick and etcd's bind (CI saw a peer port go
    that way); start picks again instead of failing."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        picks = iter([taken])
        real_free_port = embedded_etcd.free_port
        monkeypatch.setattr(
            embedded_etcd, "free_port", lambda host, avoid=0: next(picks, None) or real_free_port(host, avoid)
        )
        with EmbeddedEtcd(tmp_path) as etcd:
            port = int(etcd.endpoint.rpartition(":")[2])
            assert port != taken
            with EtcdClient(etcd.endpoint) as client:
                client.put("/k", b"v")
        assert b"address already in use" in (tmp_path / "etcd.log").read_bytes()  # the first try failed
        assert str(taken) not in (tmp_path / "ports.json").read_text()


def test_serves_and_advertises_the_given_host(tmp_path):
    with EmbeddedEtcd(tmp_path, host="127.0.0.2") as etcd:
        host, _, port = etcd.endpoint.rpartition(":")
        assert host == "127.0.0.2"
        with EtcdClient(etcd.endpoint) as client:
            client.put("/k", b"v")
        with pytest.raises(ConnectionRefusedError):  # not on another interface
            socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()


def test_hosts_follow_the_nameserver():
    assert etcd_hosts("127.0.0.2") == ("127.0.0.2", "127.0.0.2")
    assert etcd_hosts("0.0.0.0", "ns1.example.com:9876") == ("0.0.0.0", "ns1.example.com")
    assert etcd_hosts("0.0.0.0")[1] not in ("0.0.0.0", "")  # a wildcard is never handed out
    with pytest.raises(ValueError, match="cannot advertise the wildcard"):
        EmbeddedEtcd("unused", host="0.0.0.0")


def test_start_failure_reports_log_tail(tmp_path):
    (tmp_path / "member-data").write_text("not a directory")
    etcd = EmbeddedEtcd(tmp_path)
    with pytest.raises(EmbeddedEtcdError, match=r"exited with code .* log tail"):
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
