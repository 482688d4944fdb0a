"""A SIGSTOPped leader: its queues flow again at their new leaders while it is still paused.

A paused broker keeps its TCP connections open and answers nothing, so a request in flight to it
would wait for the SDK's request timeout (30 s by default). Its lease lapses after the TTL and a
follower takes over; the SDK must then abandon what it sent to the paused broker and retry at the
new leader (idempotently) — for sync ``send``, ``send_batch``, ``send_async`` and consumers alike.
Each test pauses the leader for much longer than a failover takes and asserts progress before it
resumes (ordering, not a time window), then that every acknowledged message is stored once.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest
from gms_cluster import LocalCluster
from ha_helpers import BROKER_TOML, HaCluster, read_store, wait_for
from processes import BrokerProcess
from test_ha_failover import leader_of, pull_all, wait_full_isr

from gms.broker.groups import coordinator_index
from gms.broker.server import broker_id_for
from gms.client import Consumer, Producer, ProducerRecord
from gms.errors import GmsError

PAUSE_S = 30  # failover takes the lease TTL (2 s) and a few round trips; a slow host, a few times that
QUEUES = 4
BATCH = 5


class Sending(threading.Thread):
    """Sends numbered messages to one queue in one of the SDK's ways until stopped; keeps what was
    acknowledged and when."""

    def __init__(self, cluster: HaCluster, topic: str, queue_id: int, how: str) -> None:
        super().__init__(name=f"{how}-q{queue_id}", daemon=True)
        self.cluster, self.topic, self.queue_id, self.how = cluster, topic, queue_id, how
        self.acked: dict[bytes, int] = {}  # body -> queue offset
        self.ack_times: list[float] = []
        self.errors: list[BaseException] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def acked_since(self, since: float) -> float | None:
        """When the first acknowledgement after ``since`` came (None: none yet)."""
        with self.lock:
            return next((t for t in self.ack_times if t > since), None)

    def _ack(self, body: bytes, offset: int, queue_id: int) -> None:
        assert queue_id == self.queue_id, f"{body!r} went to queue {queue_id}"
        with self.lock:
            self.acked[body] = offset
            self.ack_times.append(time.monotonic())

    def run(self) -> None:
        send: Callable[[list[bytes]], None] = getattr(self, f"_{self.how}")
        with Producer(nameserver=self.cluster.nameserver, acks=-1, linger_ms=1) as self.producer:
            count = 0
            while not self.stopping.is_set():
                bodies = [f"{self.name}-m{count + i}".encode() for i in range(BATCH)]
                count += BATCH
                try:
                    send(bodies)
                except (GmsError, TimeoutError) as err:
                    self.errors.append(err)

    def _send(self, bodies: list[bytes]) -> None:
        for body in bodies:
            result = self.producer.send(self.topic, body, queue=self.queue_id)
            self._ack(body, result.queue_offset, result.queue_id)

    def _send_batch(self, bodies: list[bytes]) -> None:
        results = self.producer.send_batch([ProducerRecord(self.topic, b, queue=self.queue_id) for b in bodies])
        for body, result in zip(bodies, results, strict=True):
            self._ack(body, result.queue_offset, result.queue_id)

    def _send_async(self, bodies: list[bytes]) -> None:
        futures = [self.producer.send_async(self.topic, b, queue=self.queue_id) for b in bodies]
        for body, future in zip(bodies, futures, strict=True):
            result = future.result(PAUSE_S * 2)
            self._ack(body, result.queue_offset, result.queue_id)

    def stop(self) -> None:
        self.stopping.set()
        self.join(PAUSE_S * 2)
        assert not self.is_alive(), f"{self.name} did not stop"


def paused_leader(cluster: HaCluster, topic: str) -> tuple[str, list[int]]:
    """The broker id leading queue 0, and every queue it leads."""
    queues = cluster.topic(topic).queues
    victim = queues[0].leader
    return victim, [q.queue_id for q in queues if q.leader == victim]


def pause_until(cluster: HaCluster, topic: str, victim_id: str, done: Callable[[float], bool]) -> tuple[float, float]:
    """SIGSTOP ``victim_id``; once every queue it led has another leader (at ``moved_at``), wait
    until ``done(moved_at)``; resume it (always, at PAUSE_S at the latest). (moved_at, resumed at)."""
    victim = cluster.broker_by_id(victim_id)
    victim.pause()
    paused_at = time.monotonic()
    try:
        def moved() -> bool:
            return victim_id not in {q.leader for q in cluster.topic(topic).queues}

        wait_for(moved, PAUSE_S)
        moved_at = time.monotonic()
        while time.monotonic() - paused_at < PAUSE_S and not done(moved_at):
            time.sleep(0.1)
    finally:
        victim.resume()
    return moved_at, time.monotonic()


def worst_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *(t for t in times if start < t < end), end]
    return round(max(b - a for a, b in itertools.pairwise(points)), 1)


@pytest.mark.slow
def test_sends_to_a_paused_leaders_queues_go_on_at_the_new_leader(ha_cluster):
    topic = "ha-paused"
    ha_cluster.create_topic(topic, QUEUES)
    victim_id, led = paused_leader(ha_cluster, topic)
    senders = [Sending(ha_cluster, topic, q, how) for q in led for how in ("send", "send_batch", "send_async")]
    for sender in senders:
        sender.start()
    try:
        wait_for(lambda: all(s.ack_times for s in senders), 30)
        paused_at = time.monotonic()
        moved_at, resumed_at = pause_until(ha_cluster, topic, victim_id,
                                           lambda since: all(s.acked_since(since) for s in senders))
    finally:
        for sender in senders:
            sender.stop()
    gaps = {s.name: worst_gap(s.ack_times, paused_at, resumed_at) for s in senders}
    stalled = [s.name for s in senders if not (moved_at < (s.acked_since(moved_at) or resumed_at) < resumed_at)]
    assert not stalled, (f"nothing acknowledged from the new leaders while the old one was still paused: {stalled}; "
                         f"longest time without an ack (s): {gaps}; paused {resumed_at - paused_at:.1f} s, "
                         f"leaders moved after {moved_at - paused_at:.1f} s")
    print(f"longest time without an ack (s): {gaps}; leaders moved after {moved_at - paused_at:.1f} s")
    # Every acknowledged message is stored once, where it was acknowledged, on every replica: the
    # resumed broker rejoins as a follower, its log made the new leader's.
    wait_full_isr(ha_cluster, topic)
    for q in led:
        stored = pull_all(leader_of(ha_cluster, topic, q).address, topic, q)
        bodies = [body for _, body in stored]
        assert len(bodies) == len(set(bodies)), f"queue {q}: a message stored twice"
    for broker in ha_cluster.brokers:
        broker.stop()
    for sender in senders:
        for broker in ha_cluster.brokers:
            replica = dict(read_store(broker.store_dir, topic, sender.queue_id))
            differ = {b: o for b, o in sender.acked.items() if replica.get(o) != b}
            assert not differ, f"{sender.name}: {len(differ)} acknowledged messages differ on {broker.address}"


@pytest.mark.slow
def test_a_consumer_reads_a_paused_leaders_queues_from_the_new_leader(ha_cluster):
    topic = "ha-paused-read"
    ha_cluster.create_topic(topic, QUEUES)
    victim_id, led = paused_leader(ha_cluster, topic)
    senders = [Sending(ha_cluster, topic, q, "send") for q in range(QUEUES)]
    received: dict[bytes, float] = {}
    stopping = threading.Event()

    def consume() -> None:
        with Consumer(nameserver=ha_cluster.nameserver, group="g", subscription={topic: "*"},
                      start_from="first") as consumer:
            while not stopping.is_set():
                for message in consumer.poll(100):
                    received[message.body] = time.monotonic()

    def first_reads(moved_at: float) -> dict[str, float | None]:
        """For each queue it led, when the consumer first received (since ``moved_at``) a message
        acknowledged since then (None: not yet)."""
        return {s.name: min((r for b, t in sender_acks(s).items()
                             if t > moved_at and (r := received.get(b, 0)) > moved_at), default=None)
                for s in senders if s.queue_id in led}

    reader = threading.Thread(target=consume, daemon=True)
    for thread in [*senders, reader]:
        thread.start()
    try:
        wait_for(lambda: all(any(b in received for b in s.acked) for s in senders), 30)
        paused_at = time.monotonic()
        moved_at, resumed_at = pause_until(ha_cluster, topic, victim_id,
                                           lambda since: None not in first_reads(since).values())
    finally:
        stopping.set()
        for sender in senders:
            sender.stop()
        reader.join(PAUSE_S)
    first = {name: t if t is None else round(t - paused_at, 1) for name, t in first_reads(moved_at).items()}
    late = [name for name, t in first.items() if t is None or paused_at + t >= resumed_at]
    assert not late, (f"nothing the new leaders acknowledged was read while the old one was paused: {late}; first "
                      f"read after the pause (s): {first}; paused {resumed_at - paused_at:.1f} s, leaders moved "
                      f"after {moved_at - paused_at:.1f} s")
    print(f"first read from the new leaders after the pause (s): {first}; leaders moved after "
          f"{moved_at - paused_at:.1f} s")


def sender_acks(sender: Sending) -> dict[bytes, float]:
    """Each message ``sender`` got acknowledged, with when."""
    with sender.lock:
        return dict(zip(sender.acked, sender.ack_times, strict=True))


class LongExpiryCluster(HaCluster):
    """Brokers that expire a silent group member only after MEMBER_EXPIRY_MS: a heartbeat waits up
    to half of that for its answer, far longer than the pause."""

    def add_broker(self, *args: str) -> BrokerProcess:
        config = self.root / f"broker{len(self.brokers)}.toml"
        config.write_text(f"{BROKER_TOML}member_expiry_ms = {MEMBER_EXPIRY_MS}\n")
        return LocalCluster.add_broker(self, "--config", str(config), *self.broker_args, *args)


MEMBER_EXPIRY_MS = 8 * PAUSE_S * 1000


class Reading(threading.Thread):
    """A group member polling until stopped."""

    def __init__(self, cluster: HaCluster, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"})
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.consumer:
            while not self.stopping.is_set():
                self.consumer.poll(100)

    def queues(self) -> set[int]:
        return {q.queue_id for q in self.consumer.assignment()}

    def stop(self) -> None:
        self.stopping.set()
        self.join(PAUSE_S)


@pytest.mark.slow
def test_a_group_whose_coordinator_is_paused_rebalances_at_the_next_one(tmp_path):
    """The coordinator of the group leads queue 0: paused, its lease lapses and the group has
    another coordinator; a member's heartbeat waiting on the paused one is given up, so a member
    joining meanwhile gets its share."""
    cluster = LongExpiryCluster(tmp_path).start(nameservers=1, brokers=3)
    readers: list[Reading] = []
    try:
        topic = "ha-paused-coordinator"
        cluster.create_topic(topic, QUEUES)
        victim_id, _ = paused_leader(cluster, topic)
        ids = sorted(broker_id_for(b.address) for b in cluster.brokers)
        group = next(g for g in (f"g{i}" for i in range(1000)) if ids[coordinator_index(g, len(ids))] == victim_id)
        readers.append(Reading(cluster, group, topic))
        readers[0].start()
        wait_for(lambda: readers[0].queues() == set(range(QUEUES)), 30)

        shared_at: list[float] = []

        def sharing(_: float) -> bool:
            if len(readers) == 1:
                readers.append(Reading(cluster, group, topic))  # it joins at the new coordinator
                readers[1].start()
            first, second = readers[0].queues(), readers[1].queues()
            if first and second and not first & second and first | second == set(range(QUEUES)):
                shared_at.append(time.monotonic())
            return bool(shared_at)

        moved_at, resumed_at = pause_until(cluster, topic, victim_id, sharing)
        split = [sorted(r.queues()) for r in readers]
        assert shared_at and shared_at[0] < resumed_at, (
            f"the members did not share the queues while the old coordinator was paused ({resumed_at - moved_at:.1f} s"
            f" after the leaders moved): {split}")
        print(f"the queues shared {shared_at[0] - moved_at:.1f} s after the leaders moved")
    finally:
        for reader in readers:
            reader.stop()
        cluster.stop()
