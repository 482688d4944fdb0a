"""What a new user meets on the command line, against a real cluster (etcd, a nameserver and a
broker process): the quick start's commands in order, one style of error, internal topics kept
out of the way, times read one way, dead letters shown whole, and wrong addresses explained."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer
from gms.errors import InvalidTopicError
from gms.msgid import encode_msg_id
from gms.record.layout import DELIVER_AT_PROPERTY

TIMEOUT_S = 60
FAR_FROM_UTC = "Pacific/Kiritimati"  # UTC+14: a local-time reading is 14 hours off


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cli-first-steps")).start(nameservers=1, brokers=1)
    try:
        yield running
    finally:
        running.stop()


def gms(cluster: LocalCluster, *args: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], capture_output=True, text=True,
                         env={**os.environ, "GMS_NAMESERVER": cluster.nameserver, **env}, timeout=TIMEOUT_S,
                         check=False)
    assert "Traceback" not in out.stderr, out.stderr
    assert (out.returncode == 0) == ok, (out.returncode, out.stdout, out.stderr)
    return out


@pytest.fixture
def topic(cluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    gms(cluster, "topic", "create", name, "--queues", "2")
    return name


def sent_id(produced: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(produced.stdout)["results"][0]["msg_id"])


# --- times ---------------------------------------------------------------------------------------


def test_deliver_at_reads_a_time_as_every_other_option_does(cluster, topic):
    """`--deliver-at` takes epoch ms, `…Z`, `+hh:mm`, and a time without a zone is UTC, whatever
    the machine's zone (it used to read local time and refuse the other two spellings)."""
    at_s = int(time.time()) + 3600  # whole seconds: every spelling can say it
    at_ms = at_s * 1000
    at = datetime.datetime.fromtimestamp(at_s, datetime.UTC).replace(tzinfo=None).isoformat()
    plus_one = datetime.datetime.fromtimestamp(at_s, datetime.timezone(datetime.timedelta(hours=1))).isoformat()
    for spelling in (str(at_ms), f"{at}Z", at, plus_one):
        produced = gms(cluster, "produce", topic, "later", "--deliver-at", spelling, "--json", TZ=FAR_FROM_UTC)
        shown = json.loads(gms(cluster, "msg", "show", sent_id(produced), "--json").stdout)
        assert shown["properties"][DELIVER_AT_PROPERTY] == str(at_ms), spelling
    refused = gms(cluster, "produce", topic, "x", "--deliver-at", "tomorrowish", ok=False)
    assert refused.returncode == 2 and "without a zone is UTC" in refused.stderr


# --- the quick start, in order, and errors in one style ---------------------------------------------


def test_describing_a_group_before_any_consumer_says_so(cluster, topic):
    """README's quick start describes `billing` right away: the answer says why nothing is there
    and what to run, in the one error style (no class names)."""
    unknown = gms(cluster, "group", "describe", "billing-" + topic, ok=False)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(f"Error: no broker knows consumer group billing-{topic}: no consumer of it")
    assert f"gms tail TOPIC --group billing-{topic}" in unknown.stderr
    assert "NotFoundError" not in unknown.stderr


def test_errors_name_no_exception_classes(cluster, topic):
    for args in (("topic", "create", topic), ("topic", "describe", "nope-" + topic), ("topic", "create", "bad name")):
        failed = gms(cluster, *args, ok=False)
        assert failed.returncode == 1 and failed.stderr.startswith("Error: "), failed.stderr
        assert "Error:" not in failed.stderr[len("Error: "):], failed.stderr  # "Error: BadRequestError: ..."


# --- internal topics ---------------------------------------------------------------------------------


def test_group_topics_are_listed_with_all_and_cannot_be_created_by_hand(cluster, topic):
    group = "g-" + topic
    gms(cluster, "produce", topic, "one")
    gms(cluster, "tail", topic, "--group", group, "--count", "1")  # its consumer makes %RETRY%<group>
    listed = json.loads(gms(cluster, "topic", "list", "--json").stdout)
    everything = json.loads(gms(cluster, "topic", "list", "--all", "--json").stdout)
    assert topic in listed and f"%RETRY%{group}" not in listed
    assert f"%RETRY%{group}" in everything and set(listed) <= set(everything)
    assert "%RETRY%" not in gms(cluster, "topic", "list").stdout

    for name in (f"%RETRY%{topic}", f"%DLQ%{topic}"):
        refused = gms(cluster, "topic", "create", name, ok=False)
        assert "reserved for consumer groups' retry and dead-letter topics" in refused.stderr, refused.stderr
        with Admin(nameserver=cluster.nameserver) as admin, pytest.raises(InvalidTopicError, match="reserved"):
            admin.create_topic(name)  # the nameserver refuses it, not only the CLI
    assert f"%DLQ%{topic}" not in json.loads(gms(cluster, "topic", "list", "--all", "--json").stdout)


# --- wrong addresses -----------------------------------------------------------------------------------


def test_a_broker_address_given_as_the_nameserver_is_named_as_such(cluster, topic):
    broker = cluster.brokers[0].address
    failed = gms(cluster, "topic", "describe", topic, "-n", broker, ok=False)
    assert failed.returncode == 1
    assert f"{broker} is not a nameserver" in failed.stderr and "broker's port" in failed.stderr, failed.stderr
    assert "unknown request code" not in failed.stderr


def test_a_message_id_of_another_cluster_says_so(cluster, topic):
    with socket.socket() as free:  # a port no broker of this cluster listens on
        free.bind(("127.0.0.1", 0))
        elsewhere = encode_msg_id("127.0.0.1", free.getsockname()[1], 0)
    failed = gms(cluster, "msg", "show", elsewhere, ok=False)
    assert failed.returncode == 1
    assert "is not a live broker of this cluster" in failed.stderr and "another cluster" in failed.stderr
    assert cluster.brokers[0].address in failed.stderr  # the live ones are named
    assert "cannot connect" not in failed.stderr, failed.stderr


# --- dead letters ------------------------------------------------------------------------------------


def test_dlq_show_shows_a_dead_letter_whole(cluster, topic):
    group = "dead-" + topic
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send(topic, b"poison", tag="T", keys=("k-1",), properties={"region": "eu"})
    consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"}, start_from="first",
                        max_reconsume_times=0)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        nacked = False
        while not nacked and time.monotonic() < deadline:
            for message in consumer.poll(200):
                nacked = consumer.nack(message, reason="bad input") == f"%DLQ%{group}"
    finally:
        consumer.close()
    assert nacked
    letters = json.loads(gms(cluster, "dlq", "list", group, "--json").stdout)
    assert len(letters) == 1
    letter_id = letters[0]["msg_id"]
    shown = json.loads(gms(cluster, "dlq", "show", group, letter_id, "--json").stdout)
    assert shown["properties"]["region"] == "eu" and shown["properties"]["__DLQ_REASON"] == "bad input"
    assert (shown["tag"], shown["keys"], shown["body"]) == ("T", ["k-1"], "poison")
    table = gms(cluster, "dlq", "show", group, letter_id).stdout
    assert "properties" in table and "region=eu" in table
