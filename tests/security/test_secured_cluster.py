"""Security end to end on real processes: TLS on every listener, SCRAM users, ACLs from etcd,
replica fetches only by the broker they name (the scenario of the security issue)."""

from __future__ import annotations

import re
import time

import pytest
from processes import wait_until
from secured_cluster import SecuredCluster

from gms.client import Admin, Consumer, Producer
from gms.errors import ForbiddenError, GmsError, ServiceUnavailableError, UnauthenticatedError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record.codec import encode_record
from gms.security.acl import AclRule
from gms.security.client import ClientSecurity
from gms.security.devca import ensure_dev_pki

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = SecuredCluster(tmp_path_factory.mktemp("secured")).start(brokers=2)
    yield cluster
    cluster.stop()


def producer(cluster: SecuredCluster, user: str = "", password: str | None = None, **kwargs) -> Producer:
    return Producer(nameserver=cluster.nameserver, security=cluster.security(user, password), retries=0, **kwargs)


def request_as(cluster: SecuredCluster, user: str, address: str, code: int, fields: dict, body: bytes = b"") -> None:
    """One request on a fresh authenticated connection of ``user`` (closed before returning)."""
    host, port = address.rsplit(":", 1)

    async def ask() -> None:
        conn = await Connection.open(host, int(port), security=cluster.security(user))
        try:
            await conn.request(code, fields, body)
        finally:
            conn.close()
            await conn.wait_closed()
    run(ask())


def grant(cluster: SecuredCluster, *rules: AclRule) -> None:
    with cluster.admin() as admin:
        for rule in rules:
            admin.add_acl(rule)


def revoke(cluster: SecuredCluster, *rules: AclRule) -> None:
    with cluster.admin() as admin:
        for rule in rules:
            admin.remove_acl(rule)


def test_clients_without_valid_credentials_are_refused(cluster):
    with cluster.admin() as admin:
        admin.create_topic("sec-auth", queues=2)
    for user, password in (("", None), ("alice", "wrong"), ("nobody", "whatever")):
        with producer(cluster, user, password) as p, pytest.raises(UnauthenticatedError):
            p.send("sec-auth", b"x")
    with producer(cluster, "admin") as p:  # the servers kept serving
        assert p.send("sec-auth", b"ok").queue_offset >= 0
    # The audit lines name the client as host:port, as docs/security.md shows them.
    nameserver_log = cluster.nameservers[0].log_tail(100_000)
    assert re.search(r"refused request code \d+ from 127\.0\.0\.1:\d+: not authenticated\n", nameserver_log)
    assert re.search(r"authentication from 127\.0\.0\.1:\d+ failed: ", nameserver_log)
    assert re.search(r"127\.0\.0\.1:\d+ authenticated as super:admin\n", nameserver_log)


def test_plaintext_or_untrusted_clients_fail_cleanly(cluster, tmp_path):
    plaintext = Producer(nameserver=cluster.nameserver, security=ClientSecurity(None, "admin", "admin-pw"), retries=0,
                         request_timeout_ms=3000)
    with plaintext, pytest.raises(GmsError):
        plaintext.send("sec-auth", b"x")
    other_ca = ensure_dev_pki(tmp_path / "other").ca_cert
    untrusting = Producer(nameserver=cluster.nameserver, security=cluster.security("admin", ca=other_ca), retries=0)
    with untrusting, pytest.raises(ServiceUnavailableError, match="certificate"):
        untrusting.send("sec-auth", b"x")
    with producer(cluster, "admin") as p:
        p.send("sec-auth", b"still serving")


def test_publish_needs_an_acl_and_a_grant_applies_within_a_second(cluster):
    with cluster.admin() as admin:
        admin.create_topic("sec-pub", queues=2)
    rule = AclRule("alice", "topic", "sec-pub", "publish")
    with producer(cluster, "alice") as p:
        with pytest.raises(ForbiddenError, match="sec-pub"):  # even its route: no describe
            p.send("sec-pub", b"x")
        grant(cluster, rule)
        granted = time.monotonic()
        wait_until(lambda: _sends(p, "sec-pub"), 1.0)
        assert time.monotonic() - granted < 1.0
        revoke(cluster, rule)
        wait_until(lambda: not _sends(p, "sec-pub"), 1.0)


def _sends(p: Producer, topic: str) -> bool:
    try:
        p.send(topic, b"probe")
        return True
    except ForbiddenError:
        return False


def test_a_batch_with_one_forbidden_topic_stores_nothing(cluster):
    """One SEND_BATCH carrying records of a topic alice may publish to and of one she may not:
    refused whole, nothing stored."""
    with cluster.admin() as admin:
        admin.create_topic("sec-batch-ok", queues=1)
        admin.create_topic("sec-batch-no", queues=2)
        leader = admin.route("sec-batch-ok")["queues"][0]["leader"]
        no_queue = next(q["queue_id"] for q in admin.route("sec-batch-no")["queues"] if q["leader"] == leader)
    grant(cluster, AclRule("alice", "topic", "sec-batch-ok", "publish"))
    body = (encode_record(topic="sec-batch-ok", body=b"a", queue_id=0)
            + encode_record(topic="sec-batch-no", body=b"b", queue_id=no_queue))
    with pytest.raises(ForbiddenError, match="publish topic sec-batch-no"):
        request_as(cluster, "alice", leader, RequestCode.SEND_BATCH, {"acks": 1}, body)
    leader_log = next(b for b in cluster.brokers if b.address == leader).log_tail(100_000)
    # The audit line, from the handler, naming the client as docs/security.md shows it.
    assert re.search(r"refused request code 11 from normal:alice \(127\.0\.0\.1:\d+\): ", leader_log)
    with cluster.admin() as admin:
        assert {q["max_offset"] for q in admin.topic_stats("sec-batch-ok")} == {0}
        assert {q["max_offset"] for q in admin.topic_stats("sec-batch-no")} == {0}


def test_create_topics_needs_admin_on_every_topic_it_names(cluster):
    """CREATE_TOPICS naming a topic the user may not administer is refused whole: none created."""
    grant(cluster, AclRule("alice", "topic", "sec-many-ok", "admin"))
    with Admin(nameserver=cluster.nameserver, security=cluster.security("alice")) as alice:
        with pytest.raises(ForbiddenError, match="sec-many-no"):
            alice.create_topics(["sec-many-ok", "sec-many-no"])
        assert [r.created for r in alice.create_topics([("sec-many-ok", 1)])] == [True]
    with cluster.admin() as admin:
        assert "sec-many-no" not in admin.topics()


def test_topics_stats_needs_describe_on_every_topic_it_names(cluster):
    """A topic the user may not describe is refused (its route already), the others answered; a
    TOPIC_STATS naming it is refused whole."""
    with cluster.admin() as admin:
        admin.create_topics([("sec-stats-ok", 1), ("sec-stats-no", 1)])
    grant(cluster, AclRule("alice", "topic", "sec-stats-ok", "describe"))
    with Admin(nameserver=cluster.nameserver, security=cluster.security("alice")) as alice:
        stats = alice.topics_stats(["sec-stats-ok", "sec-stats-no"])
        assert [q["max_offset"] for q in stats["sec-stats-ok"]] == [0]  # type: ignore[union-attr]
        assert isinstance(stats["sec-stats-no"], ForbiddenError)
        leader = alice.route("sec-stats-ok")["queues"][0]["leader"]
    with pytest.raises(ForbiddenError, match="describe topic sec-stats-no"):
        request_as(cluster, "alice", leader, RequestCode.TOPIC_STATS, {"topics": ["sec-stats-ok", "sec-stats-no"]})


def test_prefix_acls_and_deny_beats_allow(cluster):
    with cluster.admin() as admin:
        for topic in ("sec-pfx.a", "sec-pfx.secret"):
            admin.create_topic(topic, queues=1)
    grant(cluster, AclRule("bob", "topic", "sec-pfx.", "publish", pattern_type="prefix"),
          AclRule("bob", "topic", "sec-pfx.secret", "publish", permission="deny"))
    with producer(cluster, "bob") as p:
        p.send("sec-pfx.a", b"allowed by prefix")
        with pytest.raises(ForbiddenError):
            p.send("sec-pfx.secret", b"denied")


def test_consumers_need_subscribe_on_topic_and_group(cluster):
    with cluster.admin() as admin:
        admin.create_topic("sec-sub", queues=2)
    with producer(cluster, "admin") as p:
        for i in range(10):
            p.send("sec-sub", b"m%d" % i)

    def consume(group: str) -> list[bytes]:
        consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription={"sec-sub": "*"},
                            start_from="first", security=cluster.security("bob"), request_timeout_ms=5000)
        try:
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(got) < 10 and time.monotonic() < deadline:
                got += [bytes(m.body) for m in consumer.poll(timeout_ms=500)]
            return got
        finally:
            consumer.close()

    with pytest.raises(ForbiddenError):
        consume("sec-group")
    grant(cluster, AclRule("bob", "topic", "sec-sub", "subscribe"))
    with pytest.raises(ForbiddenError, match="group"):
        consume("sec-group")
    grant(cluster, AclRule("bob", "group", "sec-group", "subscribe"))
    assert sorted(consume("sec-group")) == sorted(b"m%d" % i for i in range(10))


def test_replica_fetch_only_by_the_broker_it_names(cluster):
    """A forged REPLICA_FETCH under a follower's name — from a super user or the broker
    credential — is refused, so it cannot move the high watermark; real followers replicate."""
    with cluster.admin() as admin:
        route = admin.create_topic("sec-repl", queues=1, replicas=2)
    queue = route["queues"][0]
    leader = queue["leader"]
    follower = next(r for r in queue["replicas"] if r != leader)
    follower_id = follower.replace(":", "_")
    with producer(cluster, "admin", acks=-1) as p:
        p.send("sec-repl", b"replicated")  # acks=-1: the follower, authenticated as itself, fetched it
    fetch = {"replica": follower_id, "wait_ms": 0, "queues": [["sec-repl", 0, 10, 0]]}
    copy = {"replica": follower_id, "topic": "sec-repl", "queue_id": 0, "leader_epoch": queue["leader_epoch"]}
    for user in ("admin", "svc-broker", "alice"):
        with pytest.raises(ForbiddenError, match="replica"):
            request_as(cluster, user, leader, RequestCode.REPLICA_FETCH, fetch)
        with pytest.raises(ForbiddenError, match="replica"):  # nor a copy of its compacted logs
            request_as(cluster, user, leader, RequestCode.REPLICA_COMPACTED, copy)


def test_a_forged_fetch_does_not_move_the_high_watermark(cluster):
    """The issue's attack: with the follower stalled, a fetch in its name claiming it has the new
    record would advance the HW (and acknowledge acks=-1 sends). Refused, the HW stays put until
    the real follower fetches."""
    with cluster.admin() as admin:
        queue = admin.create_topic("sec-hw", queues=1, replicas=2)["queues"][0]
    leader, epoch = queue["leader"], queue["leader_epoch"]
    follower = next(b for b in cluster.brokers if b.address != leader)
    with producer(cluster, "admin") as p:
        p.send("sec-hw", b"before")
        wait_until(lambda: _high_watermark(cluster, leader) == 1, 10)
        follower.pause()
        try:
            p.send("sec-hw", b"not yet replicated")  # acks=1: stored on the leader only
            forged = {"replica": follower.address.replace(":", "_"), "wait_ms": 0,
                      "queues": [["sec-hw", 0, 2, epoch, epoch]]}
            with pytest.raises(ForbiddenError, match="replica"):
                request_as(cluster, "admin", leader, RequestCode.REPLICA_FETCH, forged)
            assert _high_watermark(cluster, leader) == 1
        finally:
            follower.resume()
    wait_until(lambda: _high_watermark(cluster, leader) == 2, 10)  # the real follower moves it
    leader_process = next(b for b in cluster.brokers if b.address == leader)
    assert "refused request code 200" in leader_process.log_tail(100_000)  # the audit line


def _high_watermark(cluster: SecuredCluster, leader: str) -> int:
    host, port = leader.rsplit(":", 1)

    async def ask() -> int:
        conn = await Connection.open(host, int(port), security=cluster.security("admin"))
        try:
            return int((await conn.request(RequestCode.QUERY_MAX_OFFSET, {"topic": "sec-hw", "queue_id": 0})).fields[
                "offset"])
        finally:
            conn.close()
            await conn.wait_closed()
    return run(ask())


def test_large_frames_cross_tls_whole_both_ways(cluster):
    """Frames of 64 KiB and more skip the transport's write on plain sockets (gms.net.writes);
    under TLS they must not: a send of large batches and the fetch that reads them back."""
    with cluster.admin() as admin:
        admin.create_topic("sec-large", queues=1)
    bodies = [bytes([i]) * 300_000 for i in range(8)]
    with producer(cluster, "admin") as p:
        for body in bodies:
            p.send_async("sec-large", body)
        p.flush()
    consumer = Consumer(nameserver=cluster.nameserver, group="sec-large-group", subscription={"sec-large": "*"},
                        start_from="first", security=cluster.security("admin"), request_timeout_ms=5000)
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(bodies) and time.monotonic() < deadline:
            got += [bytes(m.body) for m in consumer.poll(timeout_ms=500)]
    finally:
        consumer.close()
    assert got == bodies
