"""BrokerRegistration against a real embedded etcd and a real in-process NameServer (the broker
itself is a fake address: registration needs no broker process)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from processes import wait_until
from test_server_helpers import RunningNameServer

from gms.broker.registration import Assignments, BrokerRegistration, TopicAssignment
from gms.cluster.model import BrokerInfo, TopicSettings
from gms.errors import GmsError, ServiceUnavailableError
from gms.nameserver.embedded_etcd import EmbeddedEtcd, free_port
from gms.protocol.codes import RequestCode as C

SHORT_TTL_S = 2


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Assignments] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, assignments: Assignments) -> None:
        with self.lock:
            self.calls.append(assignments)
            self.threads.add(threading.current_thread().name)

    @property
    def last(self) -> Assignments:
        with self.lock:
            return self.calls[-1]


@pytest.fixture
def ns(etcd: EmbeddedEtcd, prefix: str) -> Iterator[RunningNameServer]:
    server = RunningNameServer(etcd.endpoint, prefix)
    yield server
    server.stop()


def broker_ids(ns: RunningNameServer) -> list[str]:
    return [b["broker_id"] for b in ns.call(C.GET_BROKER_LIST)["brokers"]]


def held(a: TopicAssignment) -> tuple[int, tuple[int, ...], tuple[int, ...], TopicSettings]:
    """The placement part of an assignment (the broker side adds partition state to it)."""
    return a.queue_count, a.leader_queue_ids, a.follower_queue_ids, a.settings


def test_register_follow_assignment_and_deregister(ns, metadata):
    other = metadata.register_broker(BrokerInfo("b0", "10.0.0.1:10911"), ttl_s=5)
    recorder = Recorder()
    reg = BrokerRegistration(ns.address, BrokerInfo("b1", "10.0.0.2:10911"), recorder).start()
    try:
        assert recorder.calls == [{}]  # the initial assignment, before start() returned
        assert reg.alive
        wait_until(lambda: broker_ids(ns) == ["b0", "b1"], 1)

        ns.call(C.CREATE_TOPIC, {"topic": "solo", "queues": 4})
        wait_until(lambda: "solo" in recorder.last, 2)
        assert set(recorder.last) == {"solo"}
        assert held(recorder.last["solo"]) == (4, (1, 3), (), TopicSettings(min_insync_replicas=1))

        ns.call(C.CREATE_TOPIC, {"topic": "dup", "queues": 3, "replicas": 2})
        wait_until(lambda: "dup" in recorder.last, 2)
        # replica j of queue i on broker (i + j) mod 2: b1 leads 1, follows 0 and 2
        assert held(recorder.last["dup"]) == (3, (1,), (0, 2), TopicSettings(min_insync_replicas=2))

        ns.call(C.UPDATE_TOPIC, {"topic": "solo", "queues": 6})
        wait_until(lambda: recorder.last["solo"].queue_count == 6, 2)
        assert recorder.last["solo"].leader_queue_ids == (1, 3, 5)

        calls = len(recorder.calls)
        ns.call(C.CREATE_TOPIC, {"topic": "elsewhere", "queues": 1})  # only on b0
        ns.call(C.DELETE_TOPIC, {"topic": "dup"})
        wait_until(lambda: "dup" not in recorder.last, 2)
        assert set(recorder.last) == {"solo"}
        assert len(recorder.calls) == calls + 1  # "elsewhere" changed nothing for b1
        assert reg.assignments == recorder.last
        assert recorder.threads - {"MainThread"}  # changes arrive on the watch thread
    finally:
        reg.stop()
        other.close()
    wait_until(lambda: broker_ids(ns) == [], 1)  # revoked at once, not after the TTL
    reg.stop()  # idempotent


def test_fails_over_across_nameservers(ns):
    dead = f"127.0.0.1:{free_port()}"
    reg = BrokerRegistration(f"{dead},{ns.address}", BrokerInfo("b1", "10.0.0.2:10911"), Recorder())
    try:
        reg.start()
        assert reg.etcd_endpoints == ns.call(C.REGISTER_BROKER)["etcd"]
        wait_until(lambda: broker_ids(ns) == ["b1"], 1)
    finally:
        reg.stop()


def test_no_nameserver_is_a_clear_error():
    dead = f"127.0.0.1:{free_port()}"
    reg = BrokerRegistration(dead, BrokerInfo("b1", "10.0.0.2:10911"), Recorder(), start_timeout_s=0.3)
    with pytest.raises(ServiceUnavailableError, match=f"no nameserver reachable.*{dead}"):
        reg.start()
    with pytest.raises(ValueError, match="not host:port"):
        BrokerRegistration("nonsense", BrokerInfo("b1", "10.0.0.2:10911"), Recorder())


CHILD = """
import sys, time
from gms.broker.registration import BrokerRegistration
from gms.cluster.model import BrokerInfo
reg = BrokerRegistration(sys.argv[1], BrokerInfo("crashy", "10.0.0.9:10911"), lambda a: None,
                         ttl_s=int(sys.argv[2])).start()
print("registered", flush=True)
time.sleep(60)
"""


def test_killed_broker_leaves_routes_within_ttl(ns, metadata):
    child = subprocess.Popen(
        [sys.executable, "-P", "-c", CHILD, ns.address, str(SHORT_TTL_S)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "registered\n"
        ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 2})
        assert ns.call(C.GET_ROUTE, {"topic": "t"})["queues"][0]["leader"] == "10.0.0.9:10911"
        child.kill()
        child.wait()
        killed = time.monotonic()
        wait_until(lambda: ns.call(C.GET_ROUTE, {"topic": "t"})["queues"][0]["leader"] is None,
                   SHORT_TTL_S + 2)
        assert time.monotonic() - killed <= SHORT_TTL_S + 1
        assert broker_ids(ns) == []
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_start_waits_for_etcd_to_come_up(tmp_path):
    """A broker started together with its cluster may find the nameserver up but etcd not yet:
    it keeps trying to register until its start timeout, instead of giving up at once."""
    etcd = EmbeddedEtcd(tmp_path / "etcd").start()
    port = int(etcd.endpoint.rpartition(":")[2])
    ns = RunningNameServer(etcd.endpoint, "/gms-late-etcd/")
    etcd.stop()
    reg = BrokerRegistration(ns.address, BrokerInfo("late", "10.0.0.3:10911"), Recorder(), start_timeout_s=60)
    outcome: list[GmsError | None] = []

    def start() -> None:
        try:
            reg.start()
            outcome.append(None)
        except GmsError as err:
            outcome.append(err)

    starter = threading.Thread(target=start)
    starter.start()
    try:
        time.sleep(1.5)
        assert not outcome  # still trying: etcd is down
        etcd = EmbeddedEtcd(tmp_path / "etcd", client_port=port).start()
        starter.join(60)
        assert outcome == [None]
        wait_until(lambda: broker_ids(ns) == ["late"], 5)
    finally:
        starter.join(60)
        reg.stop()
        ns.stop()
        etcd.stop()
