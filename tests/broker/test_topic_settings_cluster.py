"""Topic settings that brokers enforce, against real processes (embedded etcd, a nameserver, a
broker with small commitlog files and a fast retention check): message size through the SDK
producer, per-topic retention on one broker shared by two topics (and after a SIGKILL), and
``gms topic create/update/describe`` with every setting flag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
from gms_cluster import LocalCluster
from processes import BrokerProcess, wait_until

from gms.client import Admin, Producer
from gms.cluster.model import DEFAULT_COMPACTION
from gms.errors import MessageIllegalError
from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode
from gms.record import iter_records

COMMITLOG_FILE_SIZE_BYTES = 64 * 1024
RETENTION_CHECK_MS = 200
SHORT_RETENTION_MS = 1500
TIMEOUT_S = 60


def small_broker_args(tmp_path) -> list[str]:
    config = tmp_path / "broker.toml"
    config.write_text(f"[store]\nretention_check_interval_ms = {RETENTION_CHECK_MS}\ncheckpoint_interval_ms = 50\n")
    return ["--config", str(config), "--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES),
            "--cq-file-entries", "500"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("topic-settings")
    running = LocalCluster(root)
    try:
        running.etcd.start()
        running.add_nameserver()
        running.add_broker(*small_broker_args(root))
        running.wait_registered(1)
        yield running
    finally:
        running.stop()


@pytest.fixture
def admin(cluster):
    with Admin(nameserver=cluster.nameserver) as a:
        yield a


def new_topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def stats(admin: Admin, topic: str) -> tuple[int, int]:
    (queue,) = admin.topic_stats(topic)
    return queue["min_offset"], queue["max_offset"]


def pull(broker: str, topic: str, offset: int) -> tuple[str, int, list[int]]:
    host, port = broker.rsplit(":", 1)
    conn = BlockingConnection.open(host, int(port))
    try:
        frame = conn.request(RequestCode.PULL, {"topic": topic, "queue_id": 0, "offset": offset,
                                                "max_msgs": 4096, "max_bytes": 16 << 20}, timeout_ms=5000)
    finally:
        conn.close()
    offsets = [r.queue_offset for r in iter_records(bytes(frame.body))]
    return frame.fields["result"], frame.fields["next_offset"], offsets


def test_message_size_limit_through_the_producer(cluster, admin):
    topic = new_topic()
    admin.create_topic(topic, 1, settings={"message_size_bytes_max": 600})
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send(topic, b"x" * 400)
        with pytest.raises(MessageIllegalError, match=rf"{topic}'s limit of 600 bytes") as err:
            producer.send(topic, b"y" * 700)
        assert "a record of 7" in str(err.value)
        with pytest.raises(MessageIllegalError, match="600 bytes"):  # one record too big: none stored
            producer.send_batch([{"topic": topic, "body": b"z" * 100, "queue": 0}] * 5
                                + [{"topic": topic, "body": b"z" * 700, "queue": 0}])
        assert stats(admin, topic) == (0, 1)
        admin.update_topic(topic, settings={"message_size_bytes_max": 2000})
        wait_until(lambda: _sends(producer, topic, b"y" * 700), 10)
    assert stats(admin, topic)[1] == 2


def _sends(producer: Producer, topic: str, body: bytes) -> bool:
    try:
        producer.send(topic, body)
    except MessageIllegalError:
        return False  # the broker has not heard of the new limit yet
    return True


def test_retention_per_topic_on_one_broker_and_after_a_kill(cluster, admin):
    for other in admin.topics():  # their records would keep the commitlog files too
        admin.delete_topic(other)
    short, long = new_topic(), new_topic()
    admin.create_topic(short, 1, settings={"retention_ms": SHORT_RETENTION_MS})
    admin.create_topic(long, 1)  # the broker's retention: 72 h
    broker = cluster.brokers[0]
    with Producer(nameserver=cluster.nameserver) as producer:
        for _ in range(4):  # interleaved over several 64 KiB commitlog files
            producer.send_batch([{"topic": t, "body": b"m" * 200, "queue": 0} for t in (short, long) * 150])
    assert stats(admin, short) == stats(admin, long) == (0, 600)
    wait_until(lambda: stats(admin, short)[0] == 600, TIMEOUT_S)
    assert stats(admin, long) == (0, 600)
    assert pull(broker.address, short, 0)[:2] == ("offset_too_small", 600)
    assert pull(broker.address, long, 0)[2] == list(range(600))
    assert _commitlog_min(admin) == 0  # long still starts in the first file: every file stays

    broker.kill()  # SIGKILL after retention ran: recovery keeps both queues as they were
    broker.restart()
    wait_until(lambda: len(cluster.live_brokers()) == 1, TIMEOUT_S)
    assert stats(admin, short) == (600, 600) and stats(admin, long) == (0, 600)
    assert pull(broker.address, long, 0)[2] == list(range(600))

    admin.update_topic(long, settings={"retention_ms": SHORT_RETENTION_MS})  # now nobody needs the files
    wait_until(lambda: stats(admin, long)[0] == 600, TIMEOUT_S)
    wait_until(lambda: _commitlog_min(admin) > 0, TIMEOUT_S)
    assert pull(broker.address, long, 0)[:2] == ("offset_too_small", 600)
    assert sorted(os.listdir(broker.store_dir / "store" / "commitlog"))[0] != "0" * 20


def _commitlog_min(admin: Admin) -> int:
    (status,) = admin.broker_status()
    return status["commitlog_min_offset"]


def test_standalone_broker_takes_settings_itself(tmp_path):
    broker = BrokerProcess(tmp_path / "solo", small_broker_args(tmp_path)).start()
    try:
        with Admin(brokers=[broker.address]) as admin:
            admin.create_topic("solo", 1, settings={"message_size_bytes_max": 300})
            with pytest.raises(MessageIllegalError, match="solo's limit of 300"), \
                    Producer(brokers=[broker.address]) as producer:
                producer.send("solo", b"x" * 400)
            admin.update_topic("solo", settings={"retention_ms": SHORT_RETENTION_MS})
            with Producer(brokers=[broker.address]) as producer:
                producer.send("solo", b"x" * 100)
            wait_until(lambda: stats(admin, "solo") == (1, 1), TIMEOUT_S)
            with pytest.raises(Exception, match="need a cluster"):
                admin.update_topic("solo", settings={"min_insync_replicas": 1})
    finally:
        broker.stop()
    topics = json.loads((tmp_path / "solo" / "store" / "config" / "topics.json").read_text())
    assert topics["topics"]["solo"] == {"queue_count": 1, "created_at_offset": 0,
                                        "retention_ms": SHORT_RETENTION_MS, "message_size_bytes_max": 300}


def gms(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], capture_output=True, text=True,
                            env={**os.environ, "GMS_NAMESERVER": cluster.nameserver}, timeout=TIMEOUT_S,
                            check=False)
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode == 0) == ok, result.stderr
    return result


def test_cli_flags_and_update_changes_only_what_it_names(cluster):
    topic = new_topic()
    created = json.loads(gms(cluster, "topic", "create", topic, "--queues", "2", "--retention-hours", "2",
                             "--message-size-max", "5000", "--min-insync-replicas", "1",
                             "--unclean-leader-election", "--json").stdout)
    assert created["settings"] == {"retention_ms": 7_200_000, "message_size_bytes_max": 5000,
                                   "min_insync_replicas": 1, "unclean_leader_election": True,
                                   "message_type": "mixed", "cleanup_policy": "delete", **DEFAULT_COMPACTION}
    gms(cluster, "topic", "update", topic, "--retention-ms", "60000")
    described = json.loads(gms(cluster, "topic", "describe", topic, "--json").stdout)
    assert described["replication_factor"] == 1 and len(described["queues"]) == 2
    assert described["settings"] == {**created["settings"], "retention_ms": 60_000}
    gms(cluster, "topic", "update", topic, "--no-unclean-leader-election")
    table = gms(cluster, "topic", "describe", topic).stdout
    for shown in (r"retention\s*│ 60000 ms \(1 min\)", r"5000 bytes", r"unclean leader election\s*│ off"):
        assert re.search(shown, table), table
    too_many = gms(cluster, "topic", "update", topic, "--min-insync-replicas", "2", ok=False)
    assert too_many.returncode == 1 and "min_insync_replicas must be 1..1" in too_many.stderr
    both = gms(cluster, "topic", "update", topic, "--retention-ms", "1", "--retention-hours", "1", ok=False)
    assert both.returncode == 2
