"""Message traces across a real cluster (embedded etcd, a nameserver, two brokers): a traced
producer and a traced consumer group, one message consumed at once and one nacked then consumed;
``Admin.trace`` and ``gms msg trace`` (table, JSON, exit 1 without a trace) show each message's
send, store (which broker), deliveries, retry and ack in time order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer
from gms.client.trace_format import TRACE_TOPIC
from gms.naming import retry_topic

TIMEOUT_S = 60
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("trace-cluster")).start(nameservers=1, brokers=2)
    try:
        yield running
    finally:
        running.stop()


def gms(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GMS_NAMESERVER": cluster.nameserver, "COLUMNS": "250"}
    out = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def wait_trace(admin: Admin, msg_id: str, count: int) -> list:
    deadline = time.monotonic() + 10
    while True:
        events = admin.trace(msg_id)
        if len(events) >= count or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


@pytest.fixture(scope="module")
def traced(cluster):
    """Two messages on queues of both brokers: ``ok`` consumed at once, ``flaky`` nacked once."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, 2)
    with Producer(nameserver=cluster.nameserver, trace=True) as producer:
        ok = producer.send(topic, b"ok", tag="a", keys=("order-1",), queue=0)
        flaky = producer.send(topic, b"flaky", tag="b", queue=1)
    consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"}, start_from="first",
                        retry_delays_ms=(200,), trace=True)
    done: set[bytes] = set()
    try:
        deadline = time.monotonic() + 20
        while done != {b"ok", b"flaky"} and time.monotonic() < deadline:
            for message in consumer.poll(200):
                if bytes(message.body) == b"flaky" and message.reconsume_times == 0:
                    consumer.nack(message)
                else:
                    done.add(bytes(message.body))
        member = consumer.member
    finally:
        consumer.close()  # the last poll's messages are acked here
    assert done == {b"ok", b"flaky"}
    return ok, flaky, group, member


def test_admin_trace_shows_each_message_life_in_order(cluster, traced):
    ok, flaky, group, member = traced
    with Admin(nameserver=cluster.nameserver) as admin:
        ok_events = wait_trace(admin, ok.msg_id, 4)
        flaky_events = wait_trace(admin, flaky.msg_id, 6)
        assert TRACE_TOPIC in admin.topics()  # made by the first traced client
    assert [e.event for e in ok_events] == ["send", "store", "deliver", "ack"]
    send, store, deliver, ack = ok_events
    assert (send.topic, send.queue_id, send.queue_offset, send.details["tag"], send.details["keys"],
            send.details["size"], send.details["status"]) == (ok.topic, 0, ok.queue_offset, "a", "order-1", 2, "ok")
    assert send.cost_us > 0 and send.host and send.client
    assert (store.event, store.broker, store.queue_id, store.queue_offset) == ("store", ok.broker, 0, ok.queue_offset)
    assert (deliver.group, deliver.client, deliver.attempt, deliver.topic) == (group, member, 1, ok.topic)
    assert (ack.group, ack.client) == (group, member) and ack.cost_us >= 0

    assert [e.event for e in flaky_events] == ["send", "store", "deliver", "retry", "deliver", "ack"]
    _, store, first, retry, second, ack = flaky_events
    assert store.broker == flaky.broker
    assert (first.attempt, first.topic) == (1, flaky.topic)
    assert (retry.attempt, retry.details["delay_ms"], retry.details["to"]) == (1, 200, retry_topic(group))
    assert (second.attempt, second.topic) == (2, retry_topic(group))  # the copy the retry topic delivered
    assert second.time_us - retry.time_us >= 150_000  # the backoff
    assert (ack.group, ack.client) == (group, member)
    times = [e.time_us for e in flaky_events]
    assert times == sorted(times)


def test_gms_msg_trace_prints_the_timeline(cluster, traced):
    _, flaky, group, member = traced
    with Admin(nameserver=cluster.nameserver) as admin:
        expected = [e.as_dict() for e in wait_trace(admin, flaky.msg_id, 6)]
    out = gms(cluster, "msg", "trace", flaky.msg_id)
    assert out.returncode == 0, out.stderr
    names = ("send", "store", "deliver", "retry", "ack")
    shown = [next((e for e in names if f" {e} " in line), None) for line in out.stdout.splitlines()]
    assert [e for e in shown if e] == ["send", "store", "deliver", "retry", "deliver", "ack"]
    assert f"broker {flaky.broker}" in out.stdout
    assert f"group {group}, consumer {member}" in out.stdout
    assert retry_topic(group) in out.stdout

    out = gms(cluster, "msg", "trace", flaky.msg_id, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected


def test_gms_msg_trace_without_a_trace_says_how_to_enable_it(cluster):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(topic, 1)
    with Producer(nameserver=cluster.nameserver) as producer:
        untraced = producer.send(topic, b"quiet")
    out = gms(cluster, "msg", "trace", untraced.msg_id)
    assert out.returncode == 1
    assert "no trace of message" in out.stderr and "trace=True" in out.stderr
    assert gms(cluster, "msg", "trace", "not-an-id").returncode == 2
