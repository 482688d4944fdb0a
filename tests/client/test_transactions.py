"""Transactional messages on a real broker process: half messages hidden until commit, visible
once after it, never after a rollback; check-backs resolve what a dead producer left open, and
the broker rolls back what nobody answers for; bad requests are refused and the broker serves on."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from gms.client import Admin, Consumer, Producer, SimpleConsumer, TransactionState
from gms.errors import BadRequestError, MessageIllegalError, TransactionNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import encode_record
from gms.record.layout import FLAG_HALF, TX_GROUP_PROPERTY, TX_ID_PROPERTY, TX_TIMEOUT_PROPERTY

pytestmark = pytest.mark.timeout(120)

# A producer that sends three half messages of one transaction, prints its id and waits to be killed.
HALF_SENDER = """
import sys, time
from gms.client import Producer
producer = Producer([sys.argv[1]], group=sys.argv[2])
tx = producer.begin_transaction()
for i in range(3):
    producer.send(sys.argv[3], b"child-%d" % i, transaction=tx, queue=i % 2)
print(tx.tx_id, flush=True)
time.sleep(120)
"""


def tx_broker(broker_factory, tmp_path, *, timeout_ms: int, interval_ms: int, check_max: int):
    config = tmp_path / f"tx-{timeout_ms}-{interval_ms}-{check_max}.toml"
    config.write_text(f"[broker]\ntransaction_timeout_ms = {timeout_ms}\n"
                      f"transaction_check_interval_ms = {interval_ms}\ntransaction_check_max = {check_max}\n")
    return broker_factory("--config", str(config))


def read(address: str, topic: str, group: str, within_s: float, want: int | None = None) -> list:
    """What a new consumer group reads of ``topic`` within ``within_s`` (early at ``want`` messages)."""
    consumer = Consumer([address], group=group, subscription={topic: "*"}, start_from="first")
    got: list = []
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline and (want is None or len(got) < want):
            got += consumer.poll(timeout_ms=100)
    finally:
        consumer.close()
    return got


def request(address: str, code: int, fields: dict, body: bytes = b""):
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return await conn.request(code, fields, body, timeout_ms=10_000)
        finally:
            conn.close()
    return run(main())


def kill_after_halves(address: str, group: str, topic: str) -> str:
    """Run HALF_SENDER in a child process, SIGKILL it once its halves are stored: the tx id."""
    child = subprocess.Popen([sys.executable, "-c", HALF_SENDER, address, group, topic], stdout=subprocess.PIPE,
                             text=True)
    with child:
        try:
            tx_id = child.stdout.readline().strip()  # type: ignore[union-attr]
        finally:
            child.kill()
    assert len(tx_id) == 32, tx_id
    return tx_id


def test_commit_shows_every_message_once_in_order_and_rollback_none(broker_factory, tmp_path):
    broker = tx_broker(broker_factory, tmp_path, timeout_ms=60_000, interval_ms=60_000, check_max=1)
    with Admin([broker.address]) as admin:
        admin.create_topic("orders", queues=2)
    with Producer([broker.address], group="shop") as producer:
        producer.send("orders", b"plain before", queue=0)
        with producer.begin_transaction() as tx:
            for i in range(4):
                producer.send("orders", b"tx-%d" % i, tag="created", keys=[f"order-{i}"],
                              properties={"n": str(i)}, queue=0, transaction=tx)
            producer.send("orders", b"tx-other-queue", queue=1, transaction=tx)
            # Halves are invisible to consumers and to pop until the commit.
            assert [bytes(m.body) for m in read(broker.address, "orders", "before", 1.0)] == [b"plain before"]
            with SimpleConsumer([broker.address], group="pop", subscription={"orders": "*"}, start_from="first",
                                await_duration_ms=300) as popper:
                popped = popper.receive(max_messages=32)
                assert [bytes(m.body) for m in popped] == [b"plain before"]
                for message in popped:
                    popper.ack(message)
        assert tx.state == "committed" and tx.queues == [("orders", 0), ("orders", 1)]
        rolled = producer.begin_transaction()
        producer.send("orders", b"never", transaction=rolled, queue=0)
        rolled.rollback()
        with pytest.raises(RuntimeError), producer.begin_transaction() as failed:
            producer.send("orders", b"never either", transaction=failed, queue=1)
            raise RuntimeError("the application failed")
        assert failed.state == "rolled_back"
        tx.commit()  # again: idempotent
        with pytest.raises(ValueError):
            rolled.commit()
    got = read(broker.address, "orders", "after", 3.0)
    by_queue = {q: [m for m in got if m.queue_id == q] for q in (0, 1)}
    assert [bytes(m.body) for m in by_queue[0]] == [b"plain before", *(b"tx-%d" % i for i in range(4))]
    assert [bytes(m.body) for m in by_queue[1]] == [b"tx-other-queue"]
    for i, message in enumerate(by_queue[0][1:]):
        assert message.tag == "created" and list(message.keys) == [f"order-{i}"]
        assert message.properties["n"] == str(i) and message.properties[TX_ID_PROPERTY] == tx.tx_id
    with SimpleConsumer([broker.address], group="pop", subscription={"orders": "*"}, start_from="first",
                        await_duration_ms=500) as popper:
        popped = []
        deadline = time.monotonic() + 3
        while len(popped) < 5 and time.monotonic() < deadline:
            popped += popper.receive(max_messages=32)
    assert sorted(bytes(m.body) for m in popped) == sorted([*(b"tx-%d" % i for i in range(4)), b"tx-other-queue"])
    with Admin([broker.address]) as admin:
        assert admin.list_transactions() == []


def test_a_live_producer_of_the_group_resolves_a_dead_ones_transactions(broker_factory, tmp_path):
    broker = tx_broker(broker_factory, tmp_path, timeout_ms=500, interval_ms=500, check_max=60)
    with Admin([broker.address]) as admin:
        admin.create_topic("payments", queues=2)
    committed = kill_after_halves(broker.address, "payer", "payments")
    rolled_back = kill_after_halves(broker.address, "payer", "payments")
    with Admin([broker.address]) as admin:
        listed = {row["tx_id"]: row for row in admin.list_transactions()}
    assert set(listed) == {committed, rolled_back}
    assert listed[committed]["messages"] == 3 and listed[committed]["group"] == "payer"
    asked: dict[str, list[bytes]] = {}
    lock = threading.Lock()

    def checker(tx_id, messages):
        with lock:
            asked[tx_id] = sorted(bytes(m.body) for m in messages)
        return TransactionState.COMMIT if tx_id == committed else TransactionState.ROLLBACK

    with Producer([broker.address], group="payer", transaction_checker=checker):
        got = read(broker.address, "payments", "reader", 10.0, want=3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with Admin([broker.address]) as admin:
                if not admin.list_transactions():
                    break
            time.sleep(0.1)
    assert sorted(bytes(m.body) for m in got) == [b"child-0", b"child-1", b"child-2"]
    assert asked == {committed: [b"child-0", b"child-1", b"child-2"], rolled_back: [b"child-0", b"child-1", b"child-2"]}
    time.sleep(0.5)
    assert len(read(broker.address, "payments", "again", 1.5)) == 3  # once: the rolled back ones never


def test_transactions_nobody_answers_for_are_rolled_back_after_the_checks(broker_factory, tmp_path):
    broker = tx_broker(broker_factory, tmp_path, timeout_ms=300, interval_ms=200, check_max=2)
    with Admin([broker.address]) as admin:
        admin.create_topic("lonely", queues=2)
    tx_id = kill_after_halves(broker.address, "gone", "lonely")
    deadline = time.monotonic() + 10
    with Admin([broker.address]) as admin:
        while admin.list_transactions() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert admin.list_transactions() == []
        with pytest.raises(TransactionNotFoundError, match="rolled back"):
            admin.end_transaction(tx_id, commit=True)
    assert read(broker.address, "lonely", "reader", 1.0) == []
    assert "rolled back" in broker.log_tail(20_000)


def test_a_producers_own_timeout_is_bounded_like_a_delivery_time(broker_factory, tmp_path):
    """A half asking for its first check-back in 30,000 years would never be checked nor rolled
    back, and would hold its queue's retention for good: it is checked within the broker's
    schedule_max_delay_ms, like the furthest scheduled message."""
    config = tmp_path / "bounded.toml"
    config.write_text("[broker]\ntransaction_check_max = 0\n[store]\nschedule_max_delay_ms = 300\n")
    broker = broker_factory("--config", str(config))
    with Admin([broker.address]) as admin:
        admin.create_topic("forever", queues=1)
        request(broker.address, RequestCode.SEND, {}, encode_record(
            topic="forever", body=b"x", flags=FLAG_HALF,
            properties={TX_ID_PROPERTY: "t1", TX_GROUP_PROPERTY: "g", TX_TIMEOUT_PROPERTY: str(10**18)}))
        deadline = time.monotonic() + 5
        while admin.list_transactions() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert admin.list_transactions() == []


def test_bad_transaction_requests_are_refused_and_the_broker_serves_on(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("bad-tx", queues=1)
    with pytest.raises(TransactionNotFoundError):
        request(broker.address, RequestCode.END_TRANSACTION, {"tx_id": "never-begun", "commit": True})
    for fields in ({"tx_id": 5, "commit": True}, {"tx_id": "x"}, {"tx_id": "", "commit": False},
                   {"tx_id": "x" * 200, "commit": True}, {"tx_id": "x", "commit": True, "acks": 7}):
        with pytest.raises(BadRequestError):
            request(broker.address, RequestCode.END_TRANSACTION, fields)
    for fields in ({"group": ""}, {"poll_ms": 5}, {"group": 3}, {"group": "g" * 256, "poll_ms": 10}):
        with pytest.raises(BadRequestError):
            request(broker.address, RequestCode.CHECK_TRANSACTIONS, fields)
    # A half message must name its transaction and group, and cannot be scheduled too.
    for properties in ({}, {TX_ID_PROPERTY: "t"}, {TX_GROUP_PROPERTY: "g"}):
        with pytest.raises(MessageIllegalError):
            request(broker.address, RequestCode.SEND, {}, encode_record(topic="bad-tx", body=b"x", flags=FLAG_HALF,
                                                                         properties=properties))
    assert request(broker.address, RequestCode.CHECK_TRANSACTIONS, {"group": "g", "poll_ms": 10}).fields == {
        "transactions": []}
    with Producer([broker.address]) as producer:
        producer.send("bad-tx", b"still served")
    assert [bytes(m.body) for m in read(broker.address, "bad-tx", "g", 2.0, want=1)] == [b"still served"]
