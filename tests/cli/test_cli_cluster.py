"""`gms` as real subprocesses against a real cluster (embedded etcd, a nameserver process, two
broker processes): create a topic, produce, tail, group lag, msg show, cluster status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from gms_cluster import LocalCluster

BROKERS = 2
QUEUES = 4
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cli-cluster")).start(nameservers=1, brokers=BROKERS)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def gms(cluster):
    """Run ``gms ARGS`` (``python -m gms.cli``) with GMS_NAMESERVER pointing at the cluster."""
    env = {**os.environ, "GMS_NAMESERVER": cluster.nameserver}

    def run(*args: str, input: bytes | None = None, ok: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], input=input, env=env,
                                capture_output=True, timeout=TIMEOUT_S, check=False)
        out = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(),
                                          result.stderr.decode())
        assert "Traceback" not in out.stderr, out.stderr
        if ok:
            assert out.returncode == 0, out.stderr
        return out

    return run


@pytest.fixture
def topic(gms) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    route = json.loads(gms("topic", "create", name, "--queues", str(QUEUES), "--json").stdout)
    assert len(route["queues"]) == QUEUES
    return name


def test_topic_create_spreads_and_list_describe_delete(gms, cluster, topic):
    brokers = {b.address for b in cluster.brokers}
    again = gms("topic", "create", topic, ok=False)
    assert again.returncode == 1 and again.stderr == f"Error: topic {topic} already exists\n"
    assert json.loads(gms("topic", "list", "--json").stdout)[topic] == QUEUES
    gms("produce", topic, "a", "b", "c")
    described = json.loads(gms("topic", "describe", topic, "--json").stdout)
    assert {q["leader"] for q in described["queues"]} == brokers
    assert sum(q["messages"] for q in described["queues"]) == 3
    assert set(described["brokers"]) == brokers
    table = gms("topic", "describe", topic).stdout
    assert f"topic {topic}: {QUEUES} queues, 3 messages" in table
    gms("topic", "delete", "--yes", topic)
    gone = gms("topic", "describe", topic, ok=False)
    assert gone.returncode == 1 and gone.stderr == f"Error: topic {topic} does not exist\n"


def test_produce_then_tail(gms, topic, tmp_path):
    sent = json.loads(gms("produce", topic, "one", "two", "--tag", "TagA", "--key", "order-1",
                          "--property", "src=cli", "--json").stdout)
    assert sent["sent"] == 2 and {r["queue_id"] for r in sent["results"]} == {sent["results"][0]["queue_id"]}
    gms("produce", topic, "--tag", "TagB", input=b"three\n\nfour\n")  # stdin lines, empty skipped
    gms("produce", topic, "--tag", "TagB", input=b"\x00bin\xff\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(50)))
    assert "sent 50 message(s)" in gms("produce", topic, "--file", str(lines)).stdout

    got = [json.loads(line) for line in gms("tail", topic, "--format", "json", "--count", "55").stdout.splitlines()]
    assert len(got) == 55
    bodies = {m["body"] for m in got}
    assert {"one", "two", "three", "four", "line 49"} <= bodies and "AGJpbv8=" in bodies  # base64 of \x00bin\xff
    one = next(m for m in got if m["body"] == "one")
    assert (one["tag"], one["keys"], one["properties"]) == ("TagA", ["order-1"], {"src": "cli"})

    text = gms("tail", topic, "--tag", "TagB").stdout.splitlines()  # no --count: stops when caught up
    assert len(text) == 3
    assert any(line.endswith("tag=TagB  \\x00bin\\xff") for line in text)
    assert all(line.startswith(f"{topic}/") and "@" in line for line in text)


def test_group_describe_shows_lag(gms, topic):
    gms("produce", topic, *[f"m{i}" for i in range(10)])
    assert len(gms("tail", topic, "--group", "billing", "--count", "4").stdout.splitlines()) == 4
    described = json.loads(gms("group", "describe", "billing", "--json").stdout)
    assert described["total_lag"] == 6
    assert len([r for r in described["queues"] if r["topic"] == topic]) == QUEUES  # unread queues too
    assert sum(r["committed"] or 0 for r in described["queues"]) == 4
    assert "billing" in json.loads(gms("group", "list", "--json").stdout)
    assert "total lag 6" in gms("group", "describe", "billing").stdout
    missing = gms("group", "describe", "nobody", ok=False)
    assert missing.returncode == 1 and "no broker knows consumer group nobody" in missing.stderr


def test_msg_show(gms, topic):
    result = json.loads(gms("produce", topic, "look at me", "--tag", "T", "--json").stdout)["results"][0]
    shown = json.loads(gms("msg", "show", result["msg_id"], "--json").stdout)
    assert (shown["body"], shown["tag"], shown["queue_offset"]) == ("look at me", "T", result["queue_offset"])
    assert gms("msg", "show", result["msg_id"]).stdout.rstrip().endswith("look at me")


def test_cluster_status(gms, cluster):
    status = json.loads(gms("cluster", "--json").stdout)
    assert status["healthy"] is True and status["etcd"]["healthy"] is True
    assert [n["address"] for n in status["nameservers"]] == [cluster.nameserver]
    assert sorted(b["address"] for b in status["brokers"]) == sorted(b.address for b in cluster.brokers)
    assert all(b["alive"] and b["disk_used_bytes"] > 0 for b in status["brokers"])
    assert "etcd" in gms("cluster").stdout


def test_tail_pop_hands_each_message_to_one_consumer_of_the_group_and_acknowledges_it(gms, topic):
    gms("produce", topic, *[f"p{i}" for i in range(10)])
    first = [json.loads(line) for line in gms("tail", topic, "--pop", "--group", "poppers", "--from", "first",
                                               "--count", "4", "--format", "json").stdout.splitlines()]
    rest = gms("tail", topic, "--pop", "--group", "poppers").stdout.splitlines()  # stops once none is left
    assert len(first) == 4 and {m["delivery_attempt"] for m in first} == {1}
    assert len(rest) == 6 and all(line.endswith("attempt=1") for line in rest)
    assert sorted([m["body"] for m in first] + [line.split()[-2] for line in rest]) == sorted(
        f"p{i}" for i in range(10))
    refused = gms("tail", topic, "--pop", ok=False)
    assert refused.returncode == 2 and "--pop needs --group" in refused.stderr


def test_tail_sql_prints_only_what_the_expression_selects(gms, topic):
    for i in range(6):
        gms("produce", topic, f"s{i}", "--property", f"n={i}", "--tag", "even" if i % 2 == 0 else "odd")
    lines = gms("tail", topic, "--sql", "n >= 2 AND TAGS = 'even'").stdout.splitlines()
    assert sorted(line.split()[-1] for line in lines) == ["s2", "s4"]  # each produce starts at a random queue
    bad = gms("tail", topic, "--sql", "n >", ok=False)
    assert bad.returncode == 1 and "position 3" in bad.stderr
    both = gms("tail", topic, "--sql", "n > 1", "--tag", "even", ok=False)
    assert both.returncode == 2 and "--sql filters on its own" in both.stderr


def test_group_config_sets_what_the_groups_consumers_use(gms, cluster, topic):
    from gms.client import SimpleConsumer
    from gms.naming import dlq_topic

    shown = json.loads(gms("group", "config", "settled", "--json").stdout)
    assert (shown["own"], shown["max_reconsume_times"], shown["fifo"]) == (False, 16, False)
    gms("group", "config", "settled", "--max-delivery-attempts", "2", "--retry-delays", "500ms,1s,2m")
    text = gms("group", "config", "settled").stdout
    assert "max reconsume times  1 (max delivery attempts 2)" in text and "500ms, 1s, 2m" in text
    bad = gms("group", "config", "settled", "--retry-delays", "soon", ok=False)
    assert bad.returncode == 2 and "not a delay" in bad.stderr

    gms("produce", topic, "poison")
    with SimpleConsumer(nameserver=cluster.nameserver, group="settled", subscription={topic: "*"},
                        start_from="first", await_duration_ms=500) as consumer:
        attempts = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # never acknowledged: handed out again every 200 ms
            attempts += [m.delivery_attempt for m in consumer.receive(10, invisible_duration_ms=200)]
    assert attempts == [1, 2]  # the third delivery went to the dead letters instead
    dead = json.loads(gms("tail", dlq_topic("settled"), "--format", "json").stdout.splitlines()[0])
    assert dead["body"] == "poison"

    gms("group", "config", "settled", "--reset")
    assert json.loads(gms("group", "config", "settled", "--json").stdout)["own"] is False


def test_topic_create_many_names_in_one_call(gms, cluster):
    first, second, third = (f"t-{uuid.uuid4().hex[:8]}" for _ in range(3))
    made = gms("topic", "create", first, second, "--queues", str(QUEUES))
    assert made.stdout.splitlines() == [f"created topic {first}: {QUEUES} queues on {BROKERS} broker(s)",
                                        f"created topic {second}: {QUEUES} queues on {BROKERS} broker(s)",
                                        "2 of 2 topics created"]
    mixed = gms("topic", "create", third, first, "bad/name", third, "--json", ok=False)
    assert mixed.returncode == 1
    rows = json.loads(mixed.stdout)
    assert [(r["topic"], r["created"], r["queues"]) for r in rows] == [
        (third, True, 8), (first, False, None), ("bad/name", False, None), (third, False, None)]
    assert "already exists" in rows[1]["error"] and "named more than once" in rows[3]["error"]
    assert "bad/name" in rows[2]["error"]
    failed = gms("topic", "create", first, f"{third}x", ok=False)
    assert failed.returncode == 1
    assert failed.stdout == f"created topic {third}x: 8 queues on {BROKERS} broker(s)\n"
    assert failed.stderr == f"cannot create topic {first}: topic {first} already exists\n1 of 2 topics created\n"
    listed = json.loads(gms("topic", "list", "--json").stdout)
    assert (listed[first], listed[second], listed[third], listed[f"{third}x"]) == (QUEUES, QUEUES, 8, 8)


def test_topic_delete_many_names_in_one_call(gms, cluster):
    first, second, third = (f"t-{uuid.uuid4().hex[:8]}" for _ in range(3))
    gms("topic", "create", first, second, third, "--queues", "1")
    deleted = gms("topic", "delete", first, second, "--yes")
    assert deleted.stdout.splitlines() == [f"deleted topic {first}", f"deleted topic {second}", "2 of 2 topics deleted"]
    mixed = gms("topic", "delete", third, first, "--yes", "--json", ok=False)
    assert mixed.returncode == 1
    rows = json.loads(mixed.stdout)
    assert [(r["topic"], r["deleted"]) for r in rows] == [(third, True), (first, False)]
    assert "does not exist" in rows[1]["error"]
    listed = json.loads(gms("topic", "list", "--json").stdout)
    assert not {first, second, third} & set(listed)
