"""The idempotent producer against real processes: a send whose answer is lost (the broker stopped
with SIGSTOP until the producer times out and retries) is stored once; without idempotence the
same run stores it several times; producer ids come from the nameservers' counter in etcd."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from client_helpers import consume
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer, ProducerRecord
from gms.errors import GmsError, MessageIllegalError, OutOfOrderSequenceError, UnknownProducerIdError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch
from gms.record.codec import seal_crc
from gms.record.sequence import BatchSequence, stamp_sequence

STOPPED_S = 1.5


def _send_through_a_stall(broker, producer: Producer, send) -> list:
    """Run ``send(producer)`` while the broker is stopped (it accepts the connection, the request
    waits in its socket), resume it once the producer has timed out and retried a few times."""
    results: list = []
    errors: list[GmsError] = []

    def run() -> None:
        try:
            results.append(send(producer))
        except GmsError as err:
            errors.append(err)

    broker.pause()
    try:
        sender = threading.Thread(target=run)
        sender.start()
        time.sleep(STOPPED_S)
    finally:
        broker.resume()
    sender.join(30)
    assert not errors, errors
    return results


def _stored(broker, topic: str, count: int) -> list[bytes]:
    with Consumer([broker.address], group=f"g-{uuid.uuid4().hex[:6]}", subscription={topic: "*"},
                  start_from="first") as consumer:
        got = consume(consumer, count)
        time.sleep(0.3)
        got += consumer.poll(200)
    return sorted(m.body for m in got)


@pytest.fixture
def one_queue(admin) -> str:
    name = f"idem-{uuid.uuid4().hex[:8]}"
    admin.create_topic(name, queues=1)
    return name


def _producer(broker, topic: str, **options) -> Producer:
    """A producer that times out fast and retries long, its routes looked up (a warm-up message)."""
    producer = Producer([broker.address], request_timeout_ms=300, retries=20, retry_backoff_ms=20, linger_ms=1,
                        **options)
    producer.send(topic, b"warm-up")
    return producer


def test_single_send_retried_after_timeouts_is_stored_once(broker, one_queue):
    with _producer(broker, one_queue) as producer:
        [result] = _send_through_a_stall(broker, producer, lambda p: p.send(one_queue, b"once"))
        assert producer.producer_id is not None
        assert result.queue_offset == 1
        after = producer.send(one_queue, b"next")  # the sequence goes on
    assert after.queue_offset == 2
    assert _stored(broker, one_queue, 3) == [b"next", b"once", b"warm-up"]


def test_batches_retried_after_timeouts_are_stored_once(broker, one_queue):
    records = [ProducerRecord(one_queue, b"b-%03d" % i) for i in range(100)]
    with _producer(broker, one_queue) as producer:
        [results] = _send_through_a_stall(broker, producer, lambda p: p.send_batch(records))
        assert [r.queue_offset for r in results] == list(range(1, 101))

        def pipelined(p: Producer) -> list[int]:
            futures = [p.send_async(one_queue, b"a-%03d" % i) for i in range(300)]
            p.flush()
            return [f.result().queue_offset for f in futures]
        producer.send(one_queue, b"warm-up")  # the retries above made it look its routes up again
        [offsets] = _send_through_a_stall(broker, producer, pipelined)
        assert offsets == list(range(102, 402))
    assert _stored(broker, one_queue, 402) == sorted([r.body for r in records] + [b"a-%03d" % i for i in range(300)]
                                                     + [b"warm-up"] * 2)


def test_without_idempotence_the_same_stall_stores_duplicates(broker, one_queue):
    """The run above is a real test: the same retries store the message again when not idempotent."""
    with _producer(broker, one_queue, idempotence=False) as producer:
        _send_through_a_stall(broker, producer, lambda p: p.send(one_queue, b"twice?"))
    assert _stored(broker, one_queue, 3).count(b"twice?") >= 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cluster")).start(nameservers=2, brokers=1)
    try:
        yield running
    finally:
        running.stop()


def test_producer_ids_come_from_the_nameservers_and_never_repeat(cluster):
    topic = f"ids-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, 1)
    ids = []
    for nameserver in [n.address for n in cluster.nameservers] * 2:
        with Producer(nameserver=nameserver) as producer:
            assert producer.producer_id is None  # allocated at the first send
            producer.send(topic, b"x")
            ids.append(producer.producer_id)
    assert all(isinstance(i, int) and i >= 1 for i in ids) and len(set(ids)) == len(ids), ids
    cluster.nameservers[0].stop()
    cluster.nameservers[0].restart()  # a restarted nameserver reserves a new block from etcd
    with Producer(nameserver=cluster.nameservers[0].address) as producer:
        producer.send(topic, b"y")
        assert producer.producer_id not in ids
    with Producer(nameserver=cluster.nameserver, acks=0) as producer:  # fire and forget: nothing to dedupe
        producer.send(topic, b"z")
        assert producer.producer_id is None


def _forged(topic: str, value: bytes) -> bytes:
    """A one-record send whose stamp's value is ``value`` (its CRC sealed again)."""
    body = bytearray(encode_batch([Message(topic, b"forged", queue_id=0)]))
    stamp_sequence(body, BatchSequence(1, 0, 0, 1))
    honest = BatchSequence(1, 0, 0, 1).encode()
    assert len(value) == len(honest)
    at = bytes(body).index(honest)
    body[at:at + len(value)] = value
    seal_crc(body)
    return bytes(body)


def test_stamps_that_are_not_fixed_width_hex_are_refused(broker, one_queue):
    """int() also reads signs, underscores and blanks: a forged stamp must not slip a negative
    producer id, epoch or batch number into the producer state."""
    pid = "00000000000000ab"
    for value in (f"-{pid[1:]}.00000000.0000000000000000.00000001",   # negative producer id
                  f"{pid}.-0000001.0000000000000000.00000001",        # negative epoch
                  f"{pid}.00000000.-000000000000001.00000001",        # negative batch number
                  f"{pid}.00000000.0000_00000000001.00000001",
                  f"{pid}.00000000. 00000000000001 .00000001",
                  f"{pid}.00000000.000000000000000G.00000001"):
        with pytest.raises(MessageIllegalError, match="__PRODUCER_SEQ"):
            _request(broker.address, RequestCode.SEND, _forged(one_queue, value.encode()))
    # the largest batch number is read as a number, not wrapped: refused as the start of a producer
    # the broker does not know (that is batch 0), and as the next one after batch 0
    top = f"{pid}.00000000.ffffffffffffffff.00000001".encode()
    with pytest.raises(UnknownProducerIdError):
        _request(broker.address, RequestCode.SEND, _forged(one_queue, top))
    assert _request(broker.address, RequestCode.SEND,
                    _forged(one_queue, top.replace(b"f" * 16, b"0" * 16))).fields["queue_offsets"]
    with pytest.raises(OutOfOrderSequenceError):
        _request(broker.address, RequestCode.SEND, _forged(one_queue, top))
    with Producer([broker.address]) as producer:
        producer.send(one_queue, b"honest")
    assert _stored(broker, one_queue, 2) == [b"forged", b"honest"]


def _request(address: str, code: int, body: bytes):
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return await conn.request(code, {}, body, timeout_ms=10_000)
        finally:
            conn.close()
    return run(main())


def test_a_send_free_to_move_stays_on_its_queue_when_no_other_broker_is_there(cluster):
    """An unpinned batch whose broker stalls (its routes still come from the nameservers) moved
    to another queue of that same broker, where it is a new batch: the broker, back, stored it
    on both queues. With no other broker to go to it stays on its queue."""
    topic = f"move-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, 4)
    [broker] = cluster.brokers
    with Producer(nameserver=cluster.nameserver, request_timeout_ms=300, retries=20, retry_backoff_ms=20,
                  linger_ms=1) as producer:
        producer.send(topic, b"warm-up")
        _send_through_a_stall(broker, producer, lambda p: p.send(topic, b"once"))
    assert _stored(broker, topic, 2) == [b"once", b"warm-up"]
