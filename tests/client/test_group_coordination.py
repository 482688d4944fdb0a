"""Consumer groups across brokers, against a real cluster (embedded etcd, a nameserver, three
brokers with a short member expiry): one coordinator assigns every broker's queues, evenly per
topic, while members join and leave; the group survives a SIGKILLed coordinator."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
from gms_cluster import LocalCluster
from processes import wait_until

from gms.client import Admin, Consumer, Producer
from gms.errors import QueueHeldError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode

BROKERS = 3
MEMBER_EXPIRY_MS = 1500  # members heartbeat every 500 ms
LEASE_TTL_S = 3  # a killed broker leaves the cluster within this
TOPIC_QUEUES = (2, 6, 7)
SETTLE_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("groups")
    config = root / "broker.toml"
    config.write_text(f"[broker]\nmember_expiry_ms = {MEMBER_EXPIRY_MS}\nlease_ttl_s = {LEASE_TTL_S}\n")
    running = LocalCluster(root)
    try:
        running.etcd.start()
        running.add_nameserver()
        for _ in range(BROKERS):
            running.add_broker("--config", str(config))
        running.wait_registered(BROKERS)
        yield running
    finally:
        running.stop()


def create_topics(cluster: LocalCluster, counts: tuple[int, ...]) -> dict[str, int]:
    topics = {f"t{count}-{uuid.uuid4().hex[:6]}": count for count in counts}
    with Admin(nameserver=cluster.nameserver) as admin:
        for topic, count in topics.items():
            admin.create_topic(topic, count)
    return topics


class Member:
    """A consumer polling on its own thread, recording (topic, queue, offset) of what it got."""

    def __init__(self, cluster: LocalCluster, group: str, topics: dict[str, int],
                 deliveries: list[tuple[str, int, int]], lock: threading.Lock) -> None:
        self.consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription=dict.fromkeys(topics, "*"),
                                 start_from="first", auto_commit_interval_ms=200, long_poll_ms=500)
        self._deliveries, self._lock = deliveries, lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = [(m.topic, m.queue_id, m.queue_offset) for m in self.consumer.poll(50)]
            with self._lock:
                self._deliveries.extend(got)
        self.consumer.close()

    def assignment(self) -> list[tuple[str, int]]:
        return [tuple(q) for q in self.consumer.assignment()]

    def leave(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def settled(members: list[Member], topics: dict[str, int]) -> bool:
    """Every queue owned by exactly one member; per topic, members' counts differ by at most one."""
    owned = [m.assignment() for m in members]
    claimed = Counter(q for queues in owned for q in queues)
    if sorted(claimed) != sorted((t, q) for t, count in topics.items() for q in range(count)):
        return False
    if any(n != 1 for n in claimed.values()):
        return False
    for topic in topics:
        per_member = [sum(1 for t, _ in queues if t == topic) for queues in owned]
        if max(per_member) - min(per_member) > 1:
            return False
    return True


def produce(cluster: LocalCluster, topics: dict[str, int], count: int, sent: Counter) -> None:
    with Producer(nameserver=cluster.nameserver) as producer:
        for topic, queues in topics.items():
            results = producer.send_batch([{"topic": topic, "body": b"%d" % i, "queue": i % queues}
                                           for i in range(count)])
            sent.update((r.topic, r.queue_id, r.queue_offset) for r in results)


def wait_all_delivered(deliveries: list, lock: threading.Lock, sent: Counter, timeout_s: float = 30) -> None:
    def done() -> bool:
        with lock:
            return set(deliveries) >= set(sent)
    wait_until(done, timeout_s)


def test_members_joining_and_leaving_share_every_brokers_queues_evenly(cluster):
    topics = create_topics(cluster, TOPIC_QUEUES)
    group = f"g-{uuid.uuid4().hex[:6]}"
    deliveries: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    sent: Counter = Counter()
    members: list[Member] = []
    settle_s = []
    try:
        for target in (1, 2, 3, 5, 8, 6, 4, 2, 1):
            while len(members) < target:
                members.append(Member(cluster, group, topics, deliveries, lock))
            while len(members) > target:
                members.pop(0).leave()  # the oldest leaves: its queues move
            produce(cluster, topics, 40, sent)
            settle_s.append(wait_until(lambda: settled(members, topics), SETTLE_TIMEOUT_S))
        wait_all_delivered(deliveries, lock, sent)
    finally:
        for member in members:
            member.leave()
    counts = Counter(deliveries)
    assert set(counts) == set(sent), "missed or unexpected messages"
    twice = [key for key, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} messages delivered twice, e.g. {twice[:5]}"
    print("settle times (s):", [round(s, 2) for s in settle_s])


def coordinator_of(cluster: LocalCluster, group: str) -> str:
    with Admin(nameserver=cluster.nameserver) as admin:
        found = admin.group_coordinator(group)
    assert found is not None
    return found


def test_group_recovers_without_double_ownership_after_its_coordinator_is_killed(cluster):
    group = f"g-{uuid.uuid4().hex[:6]}"
    topics = create_topics(cluster, (6,))
    victim = next(b for b in cluster.brokers if b.address == coordinator_of(cluster, group))
    (topic,) = topics
    with Admin(nameserver=cluster.nameserver) as admin:
        survivors_queues = {q["queue_id"] for q in admin.route(topic)["queues"] if q["leader"] != victim.address}
    deliveries: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    sent: Counter = Counter()
    members = [Member(cluster, group, topics, deliveries, lock) for _ in range(3)]
    try:
        wait_until(lambda: settled(members, topics), SETTLE_TIMEOUT_S)
        produce(cluster, topics, 60, sent)
        wait_all_delivered(deliveries, lock, sent)
        victim.kill()
        # A new coordinator takes the group over; the killed broker's queues stay assigned
        # (they come back with it), nobody reads a queue twice meanwhile.
        wait_until(lambda: coordinator_of(cluster, group) != victim.address, LEASE_TTL_S * 5)
        time.sleep(MEMBER_EXPIRY_MS / 1000)
        wait_until(lambda: settled(members, topics), SETTLE_TIMEOUT_S)
        after: Counter = Counter()
        with Producer(nameserver=cluster.nameserver) as producer:
            results = producer.send_batch([{"topic": topic, "body": b"after", "queue": q}
                                           for q in sorted(survivors_queues) for _ in range(10)])
        after.update((r.topic, r.queue_id, r.queue_offset) for r in results)
        sent.update(after)
        wait_all_delivered(deliveries, lock, sent)
        assert settled(members, topics)
    finally:
        for member in members:
            member.leave()
        victim.restart()
        cluster.wait_registered(BROKERS)
    counts = Counter(deliveries)
    assert not [key for key, n in counts.items() if n > 1], "delivered twice"


def test_describe_group_reports_members_from_the_coordinator(cluster):
    topics = create_topics(cluster, (7,))
    group = f"g-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()
    members = [Member(cluster, group, topics, [], lock) for _ in range(2)]
    try:
        wait_until(lambda: settled(members, topics), SETTLE_TIMEOUT_S)
        with Admin(nameserver=cluster.nameserver) as admin:
            described = admin.group_describe(group)
            leaders = {q["queue_id"]: q["leader"] for q in admin.route(next(iter(topics)))["queues"]}
        by_member: dict[str, set] = {}
        for entry in described["members"]:
            queues = [(t, q) for t, q in entry["queues"] if t in topics]  # not the group's retry queue
            assert all(leaders[q] == entry["broker"] for _, q in queues)  # listed by leader
            by_member.setdefault(entry["member"], set()).update(queues)
        assert by_member == {m.consumer.member: set(m.assignment()) for m in members}
        assert admin_live_members(cluster, group) == sorted(by_member)
    finally:
        for member in members:
            member.leave()


def admin_live_members(cluster: LocalCluster, group: str) -> list[str]:
    with Admin(nameserver=cluster.nameserver) as admin:
        return admin.live_members(group)


def raw(address: str, code: RequestCode, fields: dict) -> dict:
    async def ask() -> dict:
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return dict((await conn.request(code, fields)).fields)
        finally:
            conn.close()
    return run(ask())


def test_a_newcomer_cannot_read_what_an_old_member_still_reads_after_coordinator_failover(cluster):
    """The hazard of a coordinator that took a group over: it knows nothing, so the first member
    to heartbeat gets every queue — but the queue's leader still sees the old member reading
    (its claim), so the newcomer may neither read the queue nor look up its start until the old
    member released it, and then starts after the old member's last commit."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    (topic,) = create_topics(cluster, (6,))
    victim_address = coordinator_of(cluster, group)
    victim = next(b for b in cluster.brokers if b.address == victim_address)
    with Admin(nameserver=cluster.nameserver) as admin:
        queue, leader = next((q["queue_id"], q["leader"]) for q in admin.route(topic)["queues"]
                             if q["leader"] != victim_address)
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send_batch([{"topic": topic, "body": b"m", "queue": queue} for _ in range(5)])
    beat = {"group": group, "subscription": {topic: "*"}}
    assert queue in raw(victim_address, RequestCode.HEARTBEAT, {**beat, "member": "old"})["assignment"][topic]
    pull = {"topic": topic, "queue_id": queue, "group": group, "max_msgs": 3}
    assert raw(leader, RequestCode.PULL, {**pull, "offset": 0, "member": "old"})["next_offset"] == 3
    raw(leader, RequestCode.COMMIT_OFFSET, {"group": group, "member": "old", "offsets": [[topic, queue, 3]]})
    reading = threading.Event()
    reading.set()

    def old_member_reads() -> None:  # long polls at the end of the queue, as a live consumer does
        while reading.is_set():
            raw(leader, RequestCode.PULL, {**pull, "offset": 5, "member": "old", "poll_ms": 200})

    reader = threading.Thread(target=old_member_reads, daemon=True)
    reader.start()
    victim.kill()
    try:
        wait_until(lambda: coordinator_of(cluster, group) != victim_address, LEASE_TTL_S * 5)
        new = coordinator_of(cluster, group)
        assigned = raw(new, RequestCode.HEARTBEAT, {**beat, "member": "new"})["assignment"][topic]
        assert queue in assigned  # the new coordinator could not know better
        with pytest.raises(QueueHeldError):
            raw(leader, RequestCode.FETCH_OFFSET, {"group": group, "member": "new", "queues": [[topic, queue]]})
        with pytest.raises(QueueHeldError):
            raw(leader, RequestCode.PULL, {**pull, "offset": 0, "member": "new"})
        held = [[topic, q] for q in range(6)]
        kept = raw(new, RequestCode.HEARTBEAT, {**beat, "member": "old", "held": held})["assignment"][topic]
        assert queue not in kept  # "new" owns it there: "old" hands it over
        reading.clear()
        reader.join(10)
        raw(leader, RequestCode.COMMIT_OFFSET, {"group": group, "member": "old", "offsets": [[topic, queue, 4]],
                                                "release": [[topic, queue]]})
        start = raw(leader, RequestCode.FETCH_OFFSET, {"group": group, "member": "new", "queues": [[topic, queue]]})
        assert start["offsets"] == [4]
        assert raw(leader, RequestCode.PULL, {**pull, "offset": 4, "member": "new"})["next_offset"] == 5
    finally:
        reading.clear()
        victim.restart()
        cluster.wait_registered(BROKERS)
