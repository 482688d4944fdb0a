"""A broker in a cluster refuses topic administration sent straight to it: topics are cluster
metadata, changed through the nameserver (``gms topic ...``) and placed by the controller. A
direct DELETE_TOPIC used to wipe the broker's replica while the nameserver kept routing to it.
A standalone broker administers its own topics."""

from __future__ import annotations

import time

import pytest
from file_modes import not_private
from gms_cluster import LocalCluster
from processes import BrokerProcess

from gms.errors import BadRequestError, GmsError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C
from gms.record import Message, encode_batch, iter_records

SENT = 20


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
    """Until ``check()`` is true; its errors (a queue not led yet: NOT_LEADER) retried meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except GmsError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def bodies(address: str, topic: str, queue_id: int) -> list[bytes]:
    pulled = request(address, C.PULL, {"topic": topic, "queue_id": queue_id, "offset": 0, "max_msgs": 100})
    return [bytes(r.body) for r in iter_records(bytes(pulled.body))]


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path).start(nameservers=1, brokers=1)
    yield running
    running.stop()


def test_cluster_broker_refuses_direct_topic_administration(cluster):
    nameserver, broker = cluster.nameservers[0].address, cluster.brokers[0]
    request(nameserver, C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
    wait_for(lambda: request(broker.address, C.TOPIC_LIST, {}).fields["topics"].get("orders") == 2)
    for queue_id in range(2):  # led here (the leadership is applied after the topic is listed)
        wait_for(lambda q=queue_id: request(broker.address, C.QUERY_MAX_OFFSET, {"topic": "orders", "queue_id": q}))
    expected = [b"m%d" % i for i in range(SENT)]
    for queue_id in range(2):
        request(broker.address, C.SEND_BATCH, {},
                encode_batch([Message("orders", body, queue_id=queue_id) for body in expected]))

    refused = {
        "delete": (C.DELETE_TOPIC, {"topic": "orders"}),
        "update": (C.UPDATE_TOPIC, {"topic": "orders", "queues": 4, "settings": {"retention_ms": 1}}),
        "create": (C.CREATE_TOPIC, {"topic": "rogue", "queues": 1}),
    }
    for what, (code, fields) in refused.items():
        with pytest.raises(BadRequestError) as err:
            request(broker.address, code, fields)
        message = str(err.value)
        assert f"cannot {what} topic" in message and f"--nameserver {nameserver}" in message, message

    # Nothing changed: the topic, its queues and its messages are all still there, still routed here.
    assert request(broker.address, C.TOPIC_LIST, {}).fields["topics"] == {"orders": 2}
    for queue_id in range(2):
        assert bodies(broker.address, "orders", queue_id) == expected
    route = request(nameserver, C.GET_ROUTE, {"topic": "orders"}).fields
    assert {q["leader"] for q in route["queues"]} == {broker.address} and len(route["queues"]) == 2
    # Group offsets stay broker administration in a cluster.
    reset = request(broker.address, C.RESET_OFFSETS, {"group": "g", "offsets": [["orders", 0, 5]]})
    assert reset.fields["offsets"] == [["orders", 0, 5]]

    # Through the nameserver the same changes reach the broker.
    request(nameserver, C.UPDATE_TOPIC, {"topic": "orders", "queues": 3})
    wait_for(lambda: request(broker.address, C.TOPIC_LIST, {}).fields["topics"].get("orders") == 3)
    request(nameserver, C.DELETE_TOPIC, {"topic": "orders"})
    wait_for(lambda: "orders" not in request(broker.address, C.TOPIC_LIST, {}).fields["topics"])

    assert broker.stop() == 0  # the cluster broker's store (replication state included) is private too
    assert (broker.store_dir / "store" / "config" / "replication.json").exists()
    assert not_private(broker.store_dir) == {}


def test_standalone_broker_administers_its_own_topics(tmp_path):
    broker = BrokerProcess(tmp_path / "solo", []).start()
    try:
        request(broker.address, C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
        request(broker.address, C.SEND_BATCH, {}, encode_batch([Message("orders", b"x", queue_id=1)]))
        request(broker.address, C.UPDATE_TOPIC, {"topic": "orders", "queues": 4})
        assert request(broker.address, C.TOPIC_LIST, {}).fields["topics"] == {"orders": 4}
        assert bodies(broker.address, "orders", 1) == [b"x"]
        request(broker.address, C.DELETE_TOPIC, {"topic": "orders"})
        assert request(broker.address, C.TOPIC_LIST, {}).fields["topics"] == {}
    finally:
        broker.stop()
