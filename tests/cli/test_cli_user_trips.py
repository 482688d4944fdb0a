"""Small things users trip on, against a real cluster (etcd, a nameserver and a broker process):
who produced a message (born_host), an id that names no message, and a tail whose broker goes
away for a moment (one warning on stderr, nothing extra on stdout)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from gms_cluster import LocalCluster

from gms.msgid import decode_msg_id, encode_msg_id

TIMEOUT_S = 60
BROKER_DOWN_S = 3.0  # several heartbeat and pull retries


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cli-trips")).start(nameservers=1, brokers=1)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def env(cluster) -> dict[str, str]:
    return {**os.environ, "GMS_NAMESERVER": cluster.nameserver}


def gms(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=False)
    assert "Traceback" not in out.stderr, out.stderr
    assert (out.returncode == 0) == ok, out.stderr
    return out


@pytest.fixture
def topic(env) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    gms(env, "topic", "create", name, "--queues", "2")
    return name


def test_produced_messages_carry_the_host_they_were_born_on(env, topic):
    sent = json.loads(gms(env, "produce", topic, "hello", "--json").stdout)
    shown = json.loads(gms(env, "msg", "show", sent["results"][0]["msg_id"], "--json").stdout)
    assert shown["born_host"] == socket.gethostname()


def test_an_id_inside_a_record_is_no_message_not_corruption(env, topic):
    sent = json.loads(gms(env, "produce", topic, "hello", "--json").stdout)
    real = decode_msg_id(sent["results"][0]["msg_id"])
    inside = encode_msg_id(real.host, real.port, real.phys_offset + 3)
    failed = gms(env, "msg", "show", inside, ok=False)
    assert failed.returncode == 1
    assert f"no message with id {inside}" in failed.stderr
    assert "corrupt" not in failed.stderr.lower()


def test_tail_survives_a_broker_blip_with_one_warning_on_stderr(env, cluster, topic):
    gms(env, "produce", topic, "before-1", "before-2")
    tail = subprocess.Popen([sys.executable, "-P", "-m", "gms.cli", "tail", topic, "-f", "--from", "first"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in tail.stdout], daemon=True).start()

    def read_line() -> str:
        return lines.get(timeout=TIMEOUT_S).rstrip("\n")

    try:
        shown = [read_line(), read_line()]
        broker = cluster.brokers[0]
        broker.kill()
        time.sleep(BROKER_DOWN_S)
        broker.restart()
        cluster.wait_registered(1)
        gms(env, "produce", topic, "after")
        shown.append(read_line())
    finally:
        tail.send_signal(signal.SIGINT)
        try:
            _, stderr = tail.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tail.kill()
            raise
    assert tail.returncode == 130  # Ctrl-C stops the follow loop between polls, then the consumer closes
    bodies = [line.rsplit("  ", 1)[1] for line in shown]
    assert sorted(bodies[:2]) == ["before-1", "before-2"] and bodies[2] == "after"
    assert lines.empty()  # nothing but the messages on stdout
    warnings = [line for line in stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, stderr
    assert "Traceback" not in stderr


def test_scheduled_messages_from_the_command_line(env, topic):
    """`gms produce --delay` stores now and delivers later; `gms msg show` says when; `gms msg
    cancel` recalls one before its time, and says so when it is too late.

    Each CLI call is a process start (seconds on a slow host), so the test asserts the order of
    events against the wall clock rather than a window: nothing is visible before the delay has
    passed, the kept message is once it has, and the recalled one never. The recalled one is due
    long after: two calls stand between its send and its cancel (a CI run once took 8 s for them)."""
    delay_s = 8
    produced_at = time.time()
    kept = json.loads(gms(env, "produce", topic, "kept", "--delay", str(delay_s), "--json").stdout)["results"][0]
    recalled = json.loads(
        gms(env, "produce", topic, "recalled", "--delay", str(delay_s + 120), "--json").stdout)["results"][0]
    shown = gms(env, "msg", "show", kept["msg_id"]).stdout
    assert "deliver at" in shown and "scheduled" in shown
    assert "cancelled" in gms(env, "msg", "cancel", recalled["msg_id"]).stdout
    assert "not a scheduled message still to deliver" in gms(env, "msg", "cancel", recalled["msg_id"], ok=False).stderr
    early = gms(env, "tail", topic).stdout
    if time.time() < produced_at + delay_s:  # the tail read the topic before the delay had passed
        assert "kept" not in early
    deadline = time.monotonic() + delay_s + 30
    while True:
        bodies = [json.loads(line)["body"] for line in gms(env, "tail", topic, "--format", "json").stdout.splitlines()]
        if bodies or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert time.time() >= produced_at + delay_s
    assert bodies == ["kept"]


def test_dead_letters_are_listed_shown_and_resent(cluster, env, topic):
    from gms.client import Consumer
    from gms.client.retries import origin_topic

    sent = json.loads(gms(env, "produce", topic, "poison", "--json").stdout)["results"][0]
    group = f"g-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"}, start_from="first",
                        max_reconsume_times=0)
    try:
        message = _first(consumer)
        assert consumer.nack(message, reason="cannot parse").startswith("%DLQ%")
        letters = json.loads(gms(env, "dlq", "list", group, "--json").stdout)
        assert [(d["topic"], d["reason"], d["original_msg_id"], d["body"]) for d in letters] == \
            [(topic, "cannot parse", sent["msg_id"], "poison")]
        assert "cannot parse" in gms(env, "dlq", "show", group, letters[0]["msg_id"]).stdout
        assert "not a dead letter" in gms(env, "dlq", "show", group, sent["msg_id"], ok=False).stderr
        gms(env, "dlq", "resend", group, letters[0]["msg_id"])
        again = _first(consumer)
        assert (bytes(again.body), origin_topic(again), again.reconsume_times) == (b"poison", topic, 0)
    finally:
        consumer.close()
    assert json.loads(gms(env, "dlq", "list", "never-failed", "--json").stdout) == []


def _first(consumer):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for message in consumer.poll(timeout_ms=200):
            return message
    raise AssertionError("nothing arrived")
