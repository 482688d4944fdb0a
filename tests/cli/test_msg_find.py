"""Finding messages by key across a real cluster (embedded etcd, a nameserver, two brokers):
``Admin.find_by_key`` and ``gms msg find`` (tables, JSON, time ranges, exit 1 when nothing is found)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Producer
from gms.errors import TopicNotFoundError

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("find-cluster")).start(nameservers=1, brokers=2)
    try:
        yield running
    finally:
        running.stop()


def gms(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GMS_NAMESERVER": cluster.nameserver}
    out = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    return out


@pytest.fixture(scope="module")
def sent(cluster):
    """A topic of 4 queues over both brokers, 40 messages with keys order-<i> and the key shared by
    all, and the time between the first 20 and the last 20."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, 4)
    with Producer(nameserver=cluster.nameserver) as producer:
        for i in range(20):
            producer.send(topic, b"early-%d" % i, keys=(f"order-{i}", "shared"), queue=i % 4)
        time.sleep(0.05)
        middle_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(20, 40):
            producer.send(topic, b"late-%d" % i, keys=(f"order-{i}", "shared"), queue=i % 4)
    return topic, middle_ms


def test_admin_finds_by_key_on_every_broker(cluster, sent):
    topic, middle_ms = sent
    with Admin(nameserver=cluster.nameserver) as admin:
        [one] = admin.find_by_key(topic, "order-7")
        assert (one.body, one.queue_id, one.keys) == (b"early-7", 3, ("order-7", "shared"))
        assert admin.view_message(one.msg_id).body == b"early-7"
        everything = admin.find_by_key(topic, "shared", max_messages=100)
        assert len(everything) == 40 and {m.queue_id for m in everything} == {0, 1, 2, 3}
        stored = [m.store_timestamp_ms for m in everything]
        assert stored == sorted(stored)
        newest = admin.find_by_key(topic, "shared", max_messages=3)  # sends 50 µs apart share a ms:
        assert sorted(m.store_timestamp_ms for m in newest) == stored[-3:]  # the newest stamps,
        assert all(m in everything for m in newest)  # whichever of those that share one
        late = admin.find_by_key(topic, "shared", begin_ms=middle_ms, max_messages=100)
        assert sorted(m.body for m in late) == sorted(b"late-%d" % i for i in range(20, 40))
        assert admin.find_by_key(topic, "order-7", begin_ms=middle_ms) == []
        assert admin.find_by_key(topic, "nobody") == []
        with pytest.raises(TopicNotFoundError):
            admin.find_by_key(f"{topic}-unknown", "order-7")


def test_cli_msg_find_prints_tables_and_json_and_fails_when_nothing_is_found(cluster, sent):
    topic, middle_ms = sent
    table = gms(cluster, "msg", "find", "--topic", topic, "--key", "order-21")
    assert table.returncode == 0, table.stderr
    assert "late-21" in table.stdout and "order-21, shared" in table.stdout and "1 message(s)" in table.stdout
    found = json.loads(gms(cluster, "msg", "find", "-t", topic, "-k", "shared", "--from", str(middle_ms),
                           "--max", "5", "--json").stdout)
    with Admin(nameserver=cluster.nameserver) as admin:
        newest = admin.find_by_key(topic, "shared", max_messages=5)
    assert [m["msg_id"] for m in found] == [m.msg_id for m in newest]
    assert all(m["body"].startswith("late-") for m in found)
    none = gms(cluster, "msg", "find", "-t", topic, "-k", "order-21", "--to", str(middle_ms))
    assert none.returncode == 1 and f"no message of topic '{topic}' with key 'order-21' stored from" in none.stderr
    unknown = gms(cluster, "msg", "find", "-t", f"{topic}-unknown", "-k", "x")
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr
    bad = gms(cluster, "msg", "find", "-t", topic, "-k", "two words")
    assert bad.returncode == 2 and "without spaces" in bad.stderr
