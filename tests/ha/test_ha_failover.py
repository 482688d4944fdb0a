"""Replication guarantees with real processes: SIGKILLed leaders lose no acks=-1 message, acks=1
loss is bounded and measured, followers leave and rejoin the ISR, a leader cut from etcd is
fenced."""

from __future__ import annotations

import threading
import time

import pytest
from ha_helpers import LAG_MAX_MS, LEASE_TTL_S, HaCluster, read_store, request, wait_for

from gms.client import Producer
from gms.errors import STORED_FIELD, GmsError, NotEnoughReplicasAfterAppendError, NotEnoughReplicasError, NotLeaderError
from gms.nameserver.server import NAMESERVER_TTL_S
from gms.protocol.codes import RequestCode, Status
from gms.record import Message, encode_batch, iter_records

FAILOVER_TIMEOUT_S = 15
REJOIN_TIMEOUT_S = 20


class QueueProducer(threading.Thread):
    """Sends numbered messages to one queue until stopped; remembers what was acknowledged."""

    def __init__(self, cluster: HaCluster, topic: str, queue_id: int, acks: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.topic, self.queue_id, self.acks = cluster, topic, queue_id, acks
        self.acked: dict[int, bytes] = {}
        self.conflicts: list[tuple[int, bytes, bytes]] = []
        self.errors: list[GmsError] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with Producer(nameserver=self.cluster.nameserver, acks=self.acks, retries=60,
                      retry_backoff_ms=20, linger_ms=0, request_timeout_ms=5000) as producer:
            i = 0
            while not self.stopping.is_set():
                body = f"q{self.queue_id}-m{i}".encode()
                i += 1
                try:
                    result = producer.send(self.topic, body, queue=self.queue_id)
                except GmsError as err:
                    self.errors.append(err)
                    continue
                old = self.acked.setdefault(result.queue_offset, body)
                if old != body:
                    self.conflicts.append((result.queue_offset, old, body))

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def pull_all(address: str, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    """Every message of a queue visible to consumers (below the HW), CRC-checked."""
    out, offset = [], 0
    while True:
        fields = {"topic": topic, "queue_id": queue_id, "offset": offset, "max_msgs": 1024}
        frame_fields, body = pull(address, fields)
        records = list(iter_records(body))
        out += [(r.queue_offset, bytes(r.body)) for r in records]
        if not records:
            return out
        offset = frame_fields["next_offset"]


def pull(address: str, fields):
    from gms.net import Connection, run

    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            frame = await conn.request(RequestCode.PULL, fields)
            return frame.fields, bytes(frame.body)
        finally:
            conn.close()

    return run(main())


def leader_of(cluster: HaCluster, topic: str, queue_id: int):
    return cluster.broker_by_id(cluster.topic(topic).queues[queue_id].leader)


def wait_new_leader(cluster: HaCluster, topic: str, queue_id: int, old: str) -> str:
    return wait_for(lambda: (lead := cluster.topic(topic).queues[queue_id].leader) not in (None, old) and lead,
                    FAILOVER_TIMEOUT_S)


def wait_full_isr(cluster: HaCluster, topic: str, replicas: int = 3) -> None:
    wait_for(lambda: all(len(q.isr) == replicas for q in cluster.topic(topic).queues), REJOIN_TIMEOUT_S)


def kill_each_leader_in_turn(cluster: HaCluster, topic: str, queues: int, pause_s: float) -> None:
    """SIGKILL the leader of each queue in turn (``pause_s`` after the last change), wait for its
    successor, restart it and wait until every replica is in sync again."""
    for q in range(queues):
        time.sleep(pause_s)
        old_id = cluster.topic(topic).queues[q].leader
        victim = cluster.broker_by_id(old_id)
        victim.kill()
        wait_new_leader(cluster, topic, q, old_id)
        victim.restart()
        wait_full_isr(cluster, topic)


@pytest.mark.slow
def test_acks_all_loses_nothing_when_every_leader_is_killed_in_turn(ha_cluster):
    topic, queues = "ha-all", 3
    ha_cluster.create_topic(topic, queues)
    producers = [QueueProducer(ha_cluster, topic, q, acks=-1) for q in range(queues)]
    for p in producers:
        p.start()
    kill_each_leader_in_turn(ha_cluster, topic, queues, 1.0)
    time.sleep(1.0)
    for p in producers:
        p.stop()
    for q, p in enumerate(producers):
        assert not p.conflicts, f"queue {q}: one offset acknowledged for two messages {p.conflicts[:3]}"
        assert len(p.acked) > 20, f"queue {q}: too few acknowledged sends ({len(p.acked)}; errors {p.errors[:3]})"
        leader = leader_of(ha_cluster, topic, q)
        read = pull_all(leader.address, topic, q)
        assert [o for o, _ in read] == list(range(len(read))), f"queue {q}: offsets not dense"
        stored = dict(read)
        missing = {o: b for o, b in p.acked.items() if stored.get(o) != b}
        assert not missing, f"queue {q}: {len(missing)} acknowledged messages lost or changed"
    # Every replica agrees offset by offset (read from the stopped brokers' files).
    for broker in ha_cluster.brokers:
        broker.stop()
    for q, p in enumerate(producers):
        replicas = [dict(read_store(b.store_dir, topic, q)) for b in ha_cluster.brokers]
        for offset, body in p.acked.items():
            assert all(r.get(offset) == body for r in replicas), f"queue {q} offset {offset} differs"
        for a in replicas:
            for b in replicas:
                common = set(a) & set(b)
                assert all(a[o] == b[o] for o in common), f"queue {q}: replicas disagree"


def test_acks_one_loss_is_bounded_by_the_unreplicated_tail(ha_cluster, capsys):
    topic = "ha-one"
    ha_cluster.create_topic(topic, 1)
    producer = QueueProducer(ha_cluster, topic, 0, acks=1)
    producer.start()
    time.sleep(1.5)
    old_id = ha_cluster.topic(topic).queues[0].leader
    victim = ha_cluster.broker_by_id(old_id)
    victim.kill()
    acked_before_kill = dict(producer.acked)
    new_id = wait_new_leader(ha_cluster, topic, 0, old_id)
    time.sleep(0.5)
    producer.stop()
    victim.restart()
    wait_full_isr(ha_cluster, topic)
    stored = dict(pull_all(ha_cluster.broker_by_id(new_id).address, topic, 0))
    lost = sorted(o for o, b in acked_before_kill.items() if stored.get(o) != b)
    if lost:  # only a tail can be lost: what the followers had not fetched yet
        assert all(stored.get(o) == b for o, b in acked_before_kill.items() if o < lost[0])
    with capsys.disabled():
        print(f"\nacks=1: {len(lost)} of {len(acked_before_kill)} acknowledged messages lost on leader SIGKILL")
    # The old leader truncated its unreplicated tail: all replicas hold the same log.
    for broker in ha_cluster.brokers:
        broker.stop()
    logs = [dict(read_store(b.store_dir, topic, 0)) for b in ha_cluster.brokers]
    assert logs[0] == logs[1] == logs[2]


def test_stopped_followers_leave_the_isr_then_acks_all_fails(ha_cluster):
    topic = "ha-isr"
    ha_cluster.create_topic(topic, 1)
    state = ha_cluster.topic(topic).queues[0]
    leader = ha_cluster.broker_by_id(state.leader)
    followers = [ha_cluster.broker_by_id(b) for b in state.replicas if b != state.leader]

    def body(text):
        return encode_batch([Message(topic=topic, body=text.encode(), queue_id=0)])

    def send(text):
        return request(leader.address, RequestCode.SEND, {"acks": -1}, body(text))

    def max_offset():
        return request(leader.address, RequestCode.QUERY_MAX_OFFSET, {"topic": topic, "queue_id": 0})["offset"]

    send("all three in sync")
    followers[0].pause()
    try:
        # Stored on the leader but not on the stopped ISR member: consumers must not see it yet.
        request(leader.address, RequestCode.SEND, {"acks": 1}, body("above the HW"))
        time.sleep(0.3)
        assert max_offset() == 1
        started = time.monotonic()
        wait_for(lambda: len(ha_cluster.topic(topic).queues[0].isr) == 2, LAG_MAX_MS / 1000 + 5)
        assert time.monotonic() - started < LAG_MAX_MS / 1000 + 3
        wait_for(lambda: max_offset() == 2)  # the ISR shrank: the HW covers the acks=1 write
        send("two in sync: still enough")
        followers[1].pause()
        try:
            with pytest.raises(NotEnoughReplicasAfterAppendError, match="after the append") as failed:
                send("stored on the leader while the last follower stops")  # fails when the ISR shrinks
            assert failed.value.fields[STORED_FIELD] is True  # a producer's retry stays on this queue
            wait_for(lambda: len(ha_cluster.topic(topic).queues[0].isr) == 1, LAG_MAX_MS / 1000 + 5)
            with pytest.raises(NotEnoughReplicasError):
                send("alone")
            request(leader.address, RequestCode.SEND, {"acks": 1}, body("acks=1 still works"))
        finally:
            followers[1].resume()
    finally:
        followers[0].resume()
    wait_full_isr(ha_cluster, topic)
    send("back to three")


def test_follower_down_for_a_while_catches_up_and_rejoins(ha_cluster):
    topic = "ha-catchup"
    ha_cluster.create_topic(topic, 1)
    state = ha_cluster.topic(topic).queues[0]
    leader = ha_cluster.broker_by_id(state.leader)
    follower = ha_cluster.broker_by_id(state.replicas[1] if state.replicas[1] != state.leader else state.replicas[2])
    follower.kill()
    wait_for(lambda: len(ha_cluster.topic(topic).queues[0].isr) == 2, LAG_MAX_MS / 1000 + 5)
    batch = encode_batch([Message(topic=topic, body=f"m{i}".encode(), queue_id=0) for i in range(500)])
    for _ in range(20):
        request(leader.address, RequestCode.SEND, {"acks": -1}, batch)
    follower.restart()
    wait_full_isr(ha_cluster, topic)
    for broker in ha_cluster.brokers:
        broker.stop()
    logs = [read_store(b.store_dir, topic, 0) for b in ha_cluster.brokers]
    assert len(logs[0]) == 10_000 and logs[0] == logs[1] == logs[2]


def test_follower_refuses_sends_and_pulls_with_not_leader(ha_cluster):
    topic = "ha-roles"
    ha_cluster.create_topic(topic, 1)
    state = ha_cluster.topic(topic).queues[0]
    follower = ha_cluster.broker_by_id(next(b for b in state.replicas if b != state.leader))
    leader_address = ha_cluster.broker_by_id(state.leader).address
    with pytest.raises(NotLeaderError) as err:
        request(follower.address, RequestCode.SEND, {"acks": 1},
                encode_batch([Message(topic=topic, body=b"x", queue_id=0)]))
    assert err.value.fields["leader"] == leader_address
    with pytest.raises(NotLeaderError):
        request(follower.address, RequestCode.PULL, {"topic": topic, "queue_id": 0, "offset": 0})
    # Replica fetches name the leader epoch: another epoch is fenced, a non-leader says so.
    epoch = state.leader_epoch
    fetch = lambda address, e: request(address, RequestCode.REPLICA_FETCH, {  # noqa: E731
        "replica": state.replicas[-1], "queues": [[topic, 0, 0, e, -1]]})["queues"][0][2]
    assert fetch(leader_address, epoch) == Status.SUCCESS
    assert fetch(leader_address, epoch + 1) == Status.FENCED_LEADER_EPOCH
    assert fetch(follower.address, epoch) == Status.NOT_LEADER
    answer = request(leader_address, RequestCode.OFFSET_FOR_LEADER_EPOCH, {"queues": [[topic, 0, epoch, epoch]]})
    assert answer["queues"][0][2:] == [Status.SUCCESS, epoch, 0]


def test_leader_cut_from_etcd_accepts_no_acks_all_write(ha_cluster):
    """SIGSTOP the leader past its lease TTL: a new leader is elected; once resumed, the old one
    must refuse acks=-1 writes (its lease is gone, its followers fetch from the new leader)."""
    topic = "ha-fence"
    ha_cluster.create_topic(topic, 1)
    old_id = ha_cluster.topic(topic).queues[0].leader
    old = ha_cluster.broker_by_id(old_id)
    body = encode_batch([Message(topic=topic, body=b"fenced?", queue_id=0)])
    old.pause()
    try:
        new_id = wait_new_leader(ha_cluster, topic, 0, old_id)
    finally:
        old.resume()
    accepted = []
    deadline = time.monotonic() + 3 * LEASE_TTL_S
    while time.monotonic() < deadline:
        try:
            accepted.append(request(old.address, RequestCode.SEND, {"acks": -1}, body, timeout_ms=8000))
        except GmsError:
            pass
        time.sleep(0.05)
    assert not accepted, f"the deposed leader acknowledged {len(accepted)} acks=-1 writes"
    new = ha_cluster.broker_by_id(new_id)
    request(new.address, RequestCode.SEND, {"acks": -1}, body)


def controller_of(cluster: HaCluster):
    for ns in cluster.nameservers:
        if ns.proc.poll() is not None:
            continue
        status = request(ns.address, RequestCode.CLUSTER_STATUS, {})
        if status["controller"]["this"]:
            return ns
    raise AssertionError("no nameserver is the controller")


@pytest.mark.slow
def test_controller_killed_mid_failover_is_finished_by_the_next(ha_cluster_two_nameservers):
    cluster = ha_cluster_two_nameservers
    topics = ["ha-ctl-a", "ha-ctl-b"]
    for topic in topics:
        cluster.create_topic(topic, 3)
    controller = wait_for(lambda: controller_of(cluster))
    victim_id = cluster.topic(topics[0]).queues[0].leader
    led = {(t, q.queue_id) for t in topics for q in cluster.topic(t).queues if q.leader == victim_id}
    cluster.broker_by_id(victim_id).kill()
    time.sleep(LEASE_TTL_S * 0.9)  # the lease is about to expire: the controller is about to act
    controller.kill()
    for topic, queue_id in led:
        new_id = wait_new_leader(cluster, topic, queue_id, victim_id)
        body = encode_batch([Message(topic=topic, body=b"after", queue_id=queue_id)])
        address = cluster.broker_by_id(new_id).address
        wait_for(lambda a=address, b=body: request(a, RequestCode.SEND, {"acks": -1}, b), 10)
    # The successor campaigns once the dead controller's election lease (10 s) expires, which
    # may be later than the failover if the old controller finished it before it died.
    assert wait_for(lambda: controller_of(cluster), NAMESERVER_TTL_S + 10) is not controller


def test_acks_all_with_sync_flush_survives_a_leader_kill(ha_cluster_sync_flush):
    cluster = ha_cluster_sync_flush
    topic = "ha-sync"
    cluster.create_topic(topic, 1)
    producer = QueueProducer(cluster, topic, 0, acks=-1)
    producer.start()
    time.sleep(1.0)
    old_id = cluster.topic(topic).queues[0].leader
    cluster.broker_by_id(old_id).kill()
    new_id = wait_new_leader(cluster, topic, 0, old_id)
    time.sleep(0.5)
    producer.stop()
    assert len(producer.acked) > 20 and not producer.conflicts
    stored = dict(pull_all(cluster.broker_by_id(new_id).address, topic, 0))
    assert all(stored.get(o) == b for o, b in producer.acked.items())


def test_deleted_and_recreated_topic_replicates_afresh(ha_cluster):
    topic = "ha-again"
    ha_cluster.create_topic(topic, 1)
    leader = leader_of(ha_cluster, topic, 0)
    batch = encode_batch([Message(topic=topic, body=b"first life", queue_id=0)] * 5)
    request(leader.address, RequestCode.SEND, {"acks": -1}, batch)
    request(ha_cluster.nameservers[0].address, RequestCode.DELETE_TOPIC, {"topic": topic})
    wait_for(lambda: all(topic not in request(b.address, RequestCode.TOPIC_LIST, {})["topics"]
                         for b in ha_cluster.brokers))
    ha_cluster.create_topic(topic, 1)
    leader = leader_of(ha_cluster, topic, 0)
    fields = request(leader.address, RequestCode.SEND, {"acks": -1},
                     encode_batch([Message(topic=topic, body=b"second life", queue_id=0)]))
    assert fields["queue_offsets"] == b"\0" * 8  # offset 0 of the new queue
