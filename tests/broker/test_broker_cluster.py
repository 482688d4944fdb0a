"""A broker started with --nameserver joins the cluster and serves the queues placed on it."""

from __future__ import annotations

import time

import pytest
from gms_cluster import LocalCluster

from gms.errors import NotCoordinatorError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C
from gms.record import Message, encode_batch


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path).start(nameservers=1, brokers=2)
    yield running
    running.stop()


def request(address: str, code, fields, body=b""):
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return await conn.request(code, fields, body)
        finally:
            conn.close()

    return run(main())


def wait_for(check, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_topic_created_through_nameserver_appears_on_brokers(cluster):
    nameserver, brokers = cluster.nameservers[0], cluster.brokers
    route = request(nameserver.address, C.CREATE_TOPIC, {"topic": "orders", "queues": 4}).fields
    leaders = {q["queue_id"]: q["leader"] for q in route["queues"]}
    assert set(leaders.values()) == {b.address for b in brokers}
    for queue_id, leader in leaders.items():
        wait_for(lambda leader=leader: request(leader, C.TOPIC_LIST, {}).fields["topics"].get("orders") == 4)
        # led there: the leadership is applied after the topic is listed (NOT_LEADER until then)
        fields = {"topic": "orders", "queue_id": queue_id}
        wait_for(lambda leader=leader, fields=fields: request(leader, C.QUERY_MAX_OFFSET, fields))
        body = encode_batch([Message(topic="orders", body=b"hello", queue_id=queue_id)])
        request(leader, C.SEND, {}, body)
        assert request(leader, C.QUERY_MAX_OFFSET, {"topic": "orders", "queue_id": queue_id}).fields["offset"] == 1
    # Every broker names the same coordinator for a group; it hands out the queues of every broker.
    coordinators = {request(b.address, C.FIND_COORDINATOR, {"group": "g"}).fields["coordinator"] for b in brokers}
    assert len(coordinators) == 1 and coordinators <= {b.address for b in brokers}
    heartbeat = {"group": "g", "member": "m", "subscription": {"orders": "*"}}
    for broker in brokers:
        if broker.address in coordinators:
            assert request(broker.address, C.HEARTBEAT, heartbeat).fields["assignment"] == {"orders": [0, 1, 2, 3]}
        else:
            with pytest.raises(NotCoordinatorError) as refused:
                request(broker.address, C.HEARTBEAT, heartbeat)
            assert {refused.value.fields["coordinator"]} == coordinators
    request(nameserver.address, C.DELETE_TOPIC, {"topic": "orders"})
    for broker in brokers:
        wait_for(lambda broker=broker: "orders" not in request(broker.address, C.TOPIC_LIST, {}).fields["topics"])


def test_broker_without_reachable_nameserver_exits_with_a_clear_error(tmp_path):
    import subprocess
    import sys

    from gms.nameserver.embedded_etcd import free_port

    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nregister_timeout_s = 1.0\n")
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "gms.broker", "--listen", "127.0.0.1:0", "--store-dir", str(tmp_path / "b"),
         "--nameserver", f"127.0.0.1:{free_port('127.0.0.1')}", "--config", str(config)],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 1
    assert "nameserver" in proc.stderr and "Traceback" not in proc.stderr
