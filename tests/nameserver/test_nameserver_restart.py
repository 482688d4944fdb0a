"""`gms-nameserver` with its embedded etcd restarted under a running broker and producer: etcd
comes back on the same client port, the broker carries on with its lease, sends resume within
the lease TTL and no acknowledged message is lost. And etcd serves on the nameserver's host."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest
from processes import BrokerProcess, NameserverProcess, alive, descendants, wait_until

from gms.broker.registration import ask_etcd_endpoints
from gms.client import Admin, Producer
from gms.cluster.etcd_client import EtcdClient
from gms.errors import GmsError
from gms.net import run

LEASE_TTL_S = 3
DOWN_S = 1.0  # how long the nameserver and its etcd stay away
SEND_GAP_S = 0.02
START_TIMEOUT_S = 20


@dataclass
class SendLog:
    """What a background producer saw: acknowledged messages and failure times."""

    acked: dict[str, bytes] = field(default_factory=dict)  # msg id -> body
    ok_times: list[float] = field(default_factory=list)
    failure_times: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def send_until_stopped(self, producer: Producer, topic: str) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"m-{n}".encode()
            n += 1
            try:
                result = producer.send(topic, body)
            except GmsError:
                self.failure_times.append(time.monotonic())
            else:
                self.acked[result.msg_id] = body
                self.ok_times.append(time.monotonic())
            time.sleep(SEND_GAP_S)


def etcd_of(nameserver: str) -> str:
    return run(ask_etcd_endpoints(nameserver, 3000))[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_sends_resume_after_nameserver_restart(tmp_path, sig):
    config = tmp_path / "broker.toml"
    config.write_text(f"[broker]\nlease_ttl_s = {LEASE_TTL_S}\n")
    ns = NameserverProcess(tmp_path / "ns").start()
    broker = BrokerProcess(tmp_path / "broker", ["--nameserver", ns.address, "--config", str(config)])
    log = SendLog()
    sender = None
    try:
        broker.start()
        with Admin(nameserver=ns.address) as admin:
            wait_until(lambda: admin.brokers() == [broker.address], START_TIMEOUT_S)
            admin.create_topic("restart", queues=4)
        etcd_before = etcd_of(ns.address)
        etcd_pids = descendants(ns.proc.pid)
        with Producer(nameserver=ns.address, request_timeout_ms=2000, retries=2) as producer:
            sender = threading.Thread(target=log.send_until_stopped, args=(producer, "restart"))
            sender.start()
            wait_until(lambda: len(log.acked) >= 20, 10)

            ns.proc.send_signal(sig)
            ns.proc.wait(15)
            wait_until(lambda: not any(alive(pid) for pid in etcd_pids), 10)  # etcd went with it
            time.sleep(DOWN_S)
            ns.restart()
            back = time.monotonic()
            acked_at_restart = len(log.acked)
            time.sleep(LEASE_TTL_S + 2)
            log.stop.set()
            sender.join(10)

        assert etcd_of(ns.address) == etcd_before  # same etcd client port after the restart
        late_failures = [t - back for t in log.failure_times if t > back + LEASE_TTL_S]
        assert not late_failures, f"sends still failed {late_failures} s after the restart"
        assert len(log.acked) > acked_at_restart + 20, "sends did not resume"
        assert any(t > back + LEASE_TTL_S for t in log.ok_times)
        with Admin(nameserver=ns.address) as admin:
            assert admin.brokers() == [broker.address]
            for msg_id, body in log.acked.items():  # every acknowledged message is stored
                assert bytes(admin.view_message(msg_id).body) == body
        assert "etcd moved" not in broker.log_tail(100_000)  # the same endpoint: no rediscovery needed
    finally:
        log.stop.set()
        if sender is not None:
            sender.join(10)
        broker.stop()
        ns.stop()


def test_embedded_etcd_serves_on_the_nameserver_host(tmp_path):
    """``--listen 127.0.0.2:0`` (another host, as far as loopback goes): brokers are handed an
    etcd endpoint on 127.0.0.2, and etcd answers there."""
    port_file = tmp_path / "ns.port"
    with open(tmp_path / "ns.log", "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gms.nameserver", "--listen", "127.0.0.2:0",
             "--data-dir", str(tmp_path / "data"), "--port-file", str(port_file)],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, START_TIMEOUT_S)
        assert proc.poll() is None, (tmp_path / "ns.log").read_text()
        etcd = etcd_of(f"127.0.0.2:{port_file.read_text()}")
        assert etcd.startswith("127.0.0.2:")
        with EtcdClient(etcd, timeout_s=2.0) as client:
            assert client.status().version
        with Admin(nameserver=f"127.0.0.2:{port_file.read_text()}") as admin:
            status = admin.cluster_status()
        assert status["etcd"]["endpoints"] == etcd
        assert [n["address"] for n in status["nameservers"]] == [f"127.0.0.2:{port_file.read_text()}"]
    finally:
        proc.terminate()
        proc.wait(15)
