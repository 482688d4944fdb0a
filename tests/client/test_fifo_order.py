"""A message group's order under load, against a real 2-broker cluster with FIFO consumers running:
one producer, several batches of a queue in flight at once (threads sending the same groups with
send, send_batch and send_async), every send acknowledged and every sender's messages stored, and
popped, in the order it sent them. A broker accepts a producer it does not know only from batch 0,
so a batch that overtakes the producer's first on a queue is refused and retried after it (the
first one used to be fenced, or stored after it); a producer the broker forgot (idle past
``producer_state_expiry_ms``) starts the queue again at 0 under a new epoch."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer, ProducerRecord, SimpleConsumer

pytestmark = pytest.mark.timeout(300)

GROUPS = 3
PER_SENDER = 120
ROUNDS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("fifo-order")
    config = root / "broker.toml"
    config.write_text("[store]\nproducer_state_expiry_ms = 1500\n")
    running = LocalCluster(root)
    running.start(nameservers=1, brokers=0)
    try:
        for _ in range(2):
            running.add_broker("--config", str(config))
        running.wait_registered(2)
        yield running
    finally:
        running.stop()


def _topic(cluster: LocalCluster, queues: int = 4) -> str:
    topic = f"fifo-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, queues)
    return topic


def _stored(cluster: LocalCluster, topic: str, count: int) -> dict[str, list[tuple[int, int, str]]]:
    """Each sender's messages as stored: (queue, offset, body) in queue order."""
    found: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    with Consumer(nameserver=cluster.nameserver, group=f"check-{uuid.uuid4().hex[:6]}",
                  subscription={topic: "*"}, start_from="first") as consumer:
        seen, deadline = 0, time.monotonic() + 60
        while seen < count and time.monotonic() < deadline:
            for message in consumer.poll(200):
                body = bytes(message.body).decode()
                found[body.rsplit(":", 1)[0]].append((message.queue_id, message.queue_offset, body))
                seen += 1
    assert seen == count, f"{seen} of {count} messages stored"
    return {sender: sorted(rows) for sender, rows in found.items()}


def _number(body: str) -> int:
    return int(body.rsplit(":", 1)[1])


def _pop_consumers(cluster: LocalCluster, topic: str, got: dict[str, list[int]], stop: threading.Event,
                   errors: list[BaseException]) -> list[threading.Thread]:
    """Two FIFO pop consumers of one group, recording what each sender's messages came as."""
    group = f"pop-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()

    def run() -> None:
        try:
            with SimpleConsumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"},
                                start_from="first", fifo=True) as consumer:
                while not stop.is_set():
                    messages = consumer.receive(16, await_duration_ms=100)
                    with lock:
                        for message in messages:
                            body = bytes(message.body).decode()
                            got[body.rsplit(":", 1)[0]].append(_number(body))
                    if messages:
                        consumer.ack(messages)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    return threads


def _senders(producer: Producer, topic: str, group: str) -> dict[str, object]:
    """Three senders of one message group: sync sends, send_batch calls and send_async."""

    def sync(sender: str) -> None:
        for i in range(PER_SENDER):
            producer.send(topic, f"{sender}:{i}".encode(), message_group=group)

    def batches(sender: str) -> None:
        for start in range(0, PER_SENDER, 8):
            producer.send_batch([ProducerRecord(topic, f"{sender}:{i}".encode(), key=group)
                                 for i in range(start, start + 8)])

    def pipelined(sender: str) -> None:
        futures = [producer.send_async(topic, f"{sender}:{i}".encode(), message_group=group)
                   for i in range(PER_SENDER)]
        for future in futures:
            future.result(120)

    return {f"{group}-sync": sync, f"{group}-batch": batches, f"{group}-async": pipelined}


def _together(start: threading.Barrier, send, sender: str, errors: list[BaseException]) -> None:
    start.wait()
    try:
        send(sender)
    except BaseException as err:  # noqa: BLE001 - reported by the test
        errors.append(err)


def test_one_producers_batches_of_a_group_are_stored_in_send_order_or_refused(cluster):
    """Every round: a fresh topic (the brokers know no producer on it), a fresh producer, nine
    senders (three per group) starting together, so that each queue's first batches race."""
    for _ in range(ROUNDS):
        topic = _topic(cluster)
        got: dict[str, list[int]] = defaultdict(list)
        stop = threading.Event()
        consumer_errors: list[BaseException] = []
        consumers = _pop_consumers(cluster, topic, got, stop, consumer_errors)
        errors: list[BaseException] = []
        try:
            with Producer(nameserver=cluster.nameserver, linger_ms=1) as producer:
                start = threading.Barrier(GROUPS * 3)

                threads = [threading.Thread(target=_together, args=(start, send, sender, errors))
                           for g in range(GROUPS) for sender, send in _senders(producer, topic, f"g{g}").items()]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(240)
            assert not errors, errors[:3]
            stored = _stored(cluster, topic, GROUPS * 3 * PER_SENDER)
            for sender, rows in stored.items():
                assert len({queue for queue, _, _ in rows}) == 1, f"{sender} spread over queues"
                numbers = [_number(body) for _, _, body in rows]
                assert numbers == list(range(PER_SENDER)), f"{sender} stored out of order: {numbers[:12]}..."
            deadline = time.monotonic() + 60
            while sum(map(len, got.values())) < GROUPS * 3 * PER_SENDER and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop.set()
            for consumer in consumers:
                consumer.join(30)
        assert not consumer_errors, consumer_errors
        for sender, numbers in got.items():
            assert numbers == list(range(PER_SENDER)), f"{sender} popped out of order: {numbers[:12]}..."


def test_a_producer_the_brokers_forgot_starts_its_queues_again(cluster):
    """Idle past the brokers' producer_state_expiry_ms (1.5 s here), a producer's next batch of a
    queue is refused as UNKNOWN_PRODUCER_ID; the producer numbers the queue from 0 under a new
    epoch and goes on, in order."""
    topic = _topic(cluster, queues=1)
    with Producer(nameserver=cluster.nameserver, linger_ms=1) as producer:
        first = [producer.send(topic, f"p:{i}".encode()) for i in range(3)]
        time.sleep(2.5)  # past the expiry; an append to another producer's queue sweeps it out
        with Producer(nameserver=cluster.nameserver) as other:
            other.send(topic, b"other:0")
            time.sleep(0.2)
            other.send(topic, b"other:1")
        later = [producer.send_async(topic, f"p:{i}".encode()) for i in range(3, 40)]
        producer.flush()
        offsets = [r.queue_offset for r in first] + [f.result().queue_offset for f in later]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    stored = _stored(cluster, topic, 42)
    assert [_number(body) for _, _, body in stored["p"]] == list(range(40))
