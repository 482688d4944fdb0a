"""Crashes: a sync-flush broker SIGKILLed mid-stream, a producer process SIGKILLed mid-batch."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

from client_helpers import consume

from gms.client import Admin, Consumer, Producer
from gms.errors import GmsError

_CHILD = """
import sys
from gms.client import Producer
address, topic = sys.argv[1], sys.argv[2]
with Producer([address]) as producer:
    for batch in range(100000):
        producer.send_batch([{"topic": topic, "body": b"%d-%d" % (batch, i)} for i in range(200)])
        print(batch, flush=True)
"""


def _new_topic(address: str) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin([address]) as admin:
        admin.create_topic(topic, queues=4)
    return topic


def test_sync_flush_broker_killed_loses_no_acknowledged_message(broker_factory):
    broker = broker_factory("--flush", "sync")
    topic = _new_topic(broker.address)
    acked: list[bytes] = []
    stop = threading.Event()

    def send(worker: int) -> None:
        with Producer([broker.address], retries=0, request_timeout_ms=2000) as producer:
            for i in range(100000):
                body = b"%d-%d" % (worker, i)
                try:
                    producer.send(topic, body)
                except GmsError:
                    return
                acked.append(body)
                if stop.is_set():
                    return

    senders = [threading.Thread(target=send, args=(w,)) for w in range(4)]
    for thread in senders:
        thread.start()
    while len(acked) < 300:
        time.sleep(0.01)
    broker.kill()
    stop.set()
    for thread in senders:
        thread.join(10)
    broker.restart()
    with Consumer([broker.address], group="check", subscription={topic: "*"}, start_from="first") as consumer:
        stored = {m.body for m in consume(consumer, len(acked) + 1000, timeout_s=3)}
    assert set(acked) <= stored, f"{len(set(acked) - stored)} acknowledged messages lost"


def test_producer_killed_mid_batch_loses_nothing_acknowledged(broker):
    topic = _new_topic(broker.address)
    child = subprocess.Popen([sys.executable, "-P", "-c", _CHILD, broker.address, topic],
                             stdout=subprocess.PIPE, text=True)
    try:
        acked_batches = [int(child.stdout.readline()) for _ in range(5)]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with Producer([broker.address]) as producer:  # the broker still serves
        producer.send(topic, b"after")
    with Consumer([broker.address], group="check", subscription={topic: "*"}, start_from="first") as consumer:
        stored = {m.body for m in consume(consumer, 200 * 100, timeout_s=3)}
    assert b"after" in stored
    for batch in acked_batches:
        assert {b"%d-%d" % (batch, i) for i in range(200)} <= stored
