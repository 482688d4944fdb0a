"""A SIGSTOPped leader: its queues flow again at their new leaders while it is still paused.

A paused broker keeps its TCP connections open and answers nothing, so a request in flight to it
would wait for the SDK's request timeout (30 s by default). Its lease lapses after the TTL and a
follower takes over; the SDK must then abandon what it sent to the paused broker and retry at the
new leader (idempotently) — for sync ``send``, ``send_batch``, ``send_async`` and consumers alike.
Each test pauses the leader for much longer than a failover takes and asserts progress before it
resumes (ordering, not a time window); the sends, that every acknowledged message is stored once.
Pop consumers and a group whose coordinator is the paused broker are checked alike.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import pytest
from gms_cluster import LocalCluster
from ha_helpers import BROKER_TOML, HaCluster, read_store, wait_for
from processes import BrokerProcess
from test_ha_failover import leader_of, pull_all, wait_full_isr

from gms.broker.groups import coordinator_index
from gms.broker.server import broker_id_for
from gms.client import Consumer, Producer, ProducerRecord, SimpleConsumer
from gms.errors import GmsError

PAUSE_S = 30  # failover takes the lease TTL (2 s) and a few round trips; a slow host, a few times that
MEMBER_EXPIRY_MS = 8 * PAUSE_S * 1000  # an unanswered heartbeat waits for half of it
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


class Paused(NamedTuple):
    paused_at: float
    moved_at: float  # every queue of the paused broker had another leader
    done_at: float | None  # the test's condition held (None: not while the broker was paused)
    resumed_at: float

    def describe(self) -> str:
        return (f"leaders moved {self.moved_at - self.paused_at:.1f} s after the pause, condition met "
                f"{'never' if self.done_at is None else f'{self.done_at - self.moved_at:.1f} s later'}, "
                f"resumed after {self.resumed_at - self.paused_at:.1f} s")


def pause_until(cluster: HaCluster, topic: str, victim_id: str, done: Callable[[float], bool]) -> Paused:
    """SIGSTOP ``victim_id``; once every queue it led has another leader (``moved_at``), wait until
    ``done(moved_at)`` holds, for PAUSE_S at most; then resume it (always)."""
    victim = cluster.broker_by_id(victim_id)
    victim.pause()
    paused_at = time.monotonic()
    done_at = None
    try:
        wait_for(lambda: victim_id not in {q.leader for q in cluster.topic(topic).queues}, PAUSE_S)
        moved_at = time.monotonic()
        while time.monotonic() - paused_at < PAUSE_S:
            if done(moved_at):
                done_at = time.monotonic()
                break
            time.sleep(0.1)
    finally:
        victim.resume()
    return Paused(paused_at, moved_at, done_at, time.monotonic())


def worst_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *(t for t in times if start < t < end), end]
    return round(max(b - a for a, b in itertools.pairwise(points)), 1)


def acks(sender: Sending) -> dict[bytes, float]:
    """Each message ``sender`` got acknowledged, with when."""
    with sender.lock:
        return dict(zip(sender.acked, sender.ack_times, strict=True))


def got_new(senders: list[Sending], got: dict[bytes, float], since: float) -> bool:
    """Whether, for each sender, a message acknowledged after ``since`` was also got after it."""
    return all(any(t > since and got.get(b, 0) > since for b, t in acks(s).items()) for s in senders)


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
        pause = pause_until(ha_cluster, topic, victim_id, lambda since: all(s.acked_since(since) for s in senders))
    finally:
        for sender in senders:
            sender.stop()
    gaps = {s.name: worst_gap(s.ack_times, pause.paused_at, pause.resumed_at) for s in senders}
    assert pause.done_at is not None, (f"not every kind of send was acknowledged by the new leaders while the old "
                                       f"one was paused: {pause.describe()}; longest time without an ack (s): {gaps}")
    print(f"longest time without an ack (s): {gaps}; {pause.describe()}")
    # Every acknowledged message is stored once, where it was acknowledged, on every replica: the
    # resumed broker rejoins as a follower, its log made the new leader's.
    wait_full_isr(ha_cluster, topic)
    for q in led:
        bodies = [body for _, body in pull_all(leader_of(ha_cluster, topic, q).address, topic, q)]
        assert len(bodies) == len(set(bodies)), f"queue {q}: a message stored twice"
    for broker in ha_cluster.brokers:
        broker.stop()
    for sender in senders:
        for broker in ha_cluster.brokers:
            replica = dict(read_store(broker.store_dir, topic, sender.queue_id))
            differ = {b: o for b, o in sender.acked.items() if replica.get(o) != b}
            assert not differ, f"{sender.name}: {len(differ)} acknowledged messages differ on {broker.address}"


def run_while_paused(cluster: HaCluster, topic: str, receive: Callable[[threading.Event, dict[bytes, float]], None],
                     ) -> Paused:
    """Send to every queue of the paused broker while ``receive(stopping, got)`` records what it
    got, and when, in ``got``; pause until it got a message acknowledged by each new leader."""
    victim_id, led = paused_leader(cluster, topic)
    senders = [Sending(cluster, topic, q, "send") for q in led]
    got: dict[bytes, float] = {}
    stopping = threading.Event()
    receiving = threading.Thread(target=receive, args=(stopping, got), daemon=True)
    for thread in [*senders, receiving]:
        thread.start()
    try:
        wait_for(lambda: all(any(b in got for b in s.acked) for s in senders), 30)
        return pause_until(cluster, topic, victim_id, lambda since: got_new(senders, got, since))
    finally:
        stopping.set()
        for sender in senders:
            sender.stop()
        receiving.join(PAUSE_S)


@pytest.mark.slow
def test_a_consumer_reads_a_paused_leaders_queues_from_the_new_leader(ha_cluster):
    topic = "ha-paused-read"
    ha_cluster.create_topic(topic, QUEUES)

    def consume(stopping: threading.Event, got: dict[bytes, float]) -> None:
        with Consumer(nameserver=ha_cluster.nameserver, group="g", subscription={topic: "*"},
                      start_from="first") as consumer:
            while not stopping.is_set():
                for message in consumer.poll(100):
                    got[message.body] = time.monotonic()

    pause = run_while_paused(ha_cluster, topic, consume)
    assert pause.done_at is not None, f"nothing the new leaders acknowledged was read meanwhile: {pause.describe()}"
    print(pause.describe())


@pytest.mark.slow
def test_a_pop_consumer_pops_a_paused_leaders_queues_at_the_new_leader(ha_cluster):
    topic = "ha-paused-pop"
    ha_cluster.create_topic(topic, QUEUES)

    def pop(stopping: threading.Event, got: dict[bytes, float]) -> None:
        consumer = SimpleConsumer(nameserver=ha_cluster.nameserver, group="g", subscription={topic: "*"},
                                  start_from="first", await_duration_ms=200)
        try:
            while not stopping.is_set():
                try:
                    messages = consumer.receive(64)
                    consumer.ack(messages)
                except GmsError:
                    continue
                for message in messages:
                    got[bytes(message.body)] = time.monotonic()
        finally:
            consumer.close()

    pause = run_while_paused(ha_cluster, topic, pop)
    assert pause.done_at is not None, f"nothing the new leaders acknowledged was popped meanwhile: {pause.describe()}"
    print(pause.describe())


class LongExpiryCluster(HaCluster):
    """Brokers that expire a silent group member only after MEMBER_EXPIRY_MS: a heartbeat waits up
    to half of that for its answer, far longer than the pause."""

    def add_broker(self, *args: str) -> BrokerProcess:
        config = self.root / f"broker{len(self.brokers)}.toml"
        config.write_text(f"{BROKER_TOML}member_expiry_ms = {MEMBER_EXPIRY_MS}\n")
        return LocalCluster.add_broker(self, "--config", str(config), *self.broker_args, *args)


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

        def shared(_: float) -> bool:
            if len(readers) == 1:
                readers.append(Reading(cluster, group, topic))  # it joins at the new coordinator
                readers[1].start()
            first, second = readers[0].queues(), readers[1].queues()
            return bool(first and second and not first & second and first | second == set(range(QUEUES)))

        pause = pause_until(cluster, topic, victim_id, shared)
        assert pause.done_at is not None, (f"the members did not share the queues while the old coordinator was "
                                           f"paused: {[sorted(r.queues()) for r in readers]}; {pause.describe()}")
        print(pause.describe())
    finally:
        for reader in readers:
            reader.stop()
        cluster.stop()
