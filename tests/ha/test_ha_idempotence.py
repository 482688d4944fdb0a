"""Exactly once across leader failover: idempotent producers (single sends, batches and pipelined
``send_async``, acks=-1) keep sending while every queue's leader is SIGKILLed in turn and
restarted; every acknowledged message is stored, and no message is stored twice -- the retries
the failover causes land on the new leader, which recognises the batches it already has."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from ha_helpers import HaCluster
from test_ha_failover import kill_each_leader_in_turn, leader_of, pull_all

from gms.client import Producer, ProducerRecord
from gms.errors import GmsError


class Sender(threading.Thread):
    """Sends numbered messages (``mode``: one at a time, batches of 20, or pipelined) until stopped."""

    def __init__(self, cluster: HaCluster, topic: str, queue_id: int, mode: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic, self.queue_id, self.mode = cluster, topic, queue_id, mode
        self.acked: list[bytes] = []
        self.errors: list[GmsError] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with Producer(nameserver=self.cluster.nameserver, acks=-1, retries=60, retry_backoff_ms=20, linger_ms=2,
                      request_timeout_ms=3000) as producer:
            i = 0
            while not self.stopping.is_set():
                size = 1 if self.mode == "one" else 20
                bodies = [f"{self.mode}-q{self.queue_id}-m{i + k}".encode() for k in range(size)]
                i += len(bodies)
                try:
                    if self.mode == "one":
                        producer.send(self.topic, bodies[0], queue=self.queue_id)
                    elif self.mode == "batch":
                        producer.send_batch([ProducerRecord(self.topic, b, queue=self.queue_id) for b in bodies])
                    else:
                        futures = [producer.send_async(self.topic, b, queue=self.queue_id) for b in bodies]
                        producer.flush()
                        for f in futures:
                            f.result()
                except GmsError as err:
                    self.errors.append(err)
                    continue
                self.acked += bodies

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)


@pytest.mark.slow
def test_retries_across_leader_failover_store_every_message_exactly_once(ha_cluster):
    topic, queues = "ha-once", 3
    ha_cluster.create_topic(topic, queues)
    senders = [Sender(ha_cluster, topic, q, mode) for q, mode in enumerate(("one", "batch", "async"))]
    for s in senders:
        s.start()
    kill_each_leader_in_turn(ha_cluster, topic, queues, 1.5)
    time.sleep(1.0)
    for s in senders:
        s.stop()
    for q, sender in enumerate(senders):
        assert len(sender.acked) > 20, f"{sender.mode}: too few acknowledged ({sender.errors[:3]})"
        stored = Counter(body for _, body in pull_all(leader_of(ha_cluster, topic, q).address, topic, q))
        twice = {b: n for b, n in stored.items() if n > 1}
        assert not twice, f"{sender.mode}: {len(twice)} messages stored more than once, e.g. {list(twice)[:3]}"
        missing = [b for b in sender.acked if b not in stored]
        assert not missing, f"{sender.mode}: {len(missing)} acknowledged messages lost"
