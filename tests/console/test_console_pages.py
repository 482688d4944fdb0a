"""Each page of the web console in headless Chromium against a real cluster with known data: it
loads, shows the numbers the test produced and consumed, draws its chart, and leaves a
screenshot for review (test-artifacts/screenshots, or $GMS_SCREENSHOT_DIR)."""

from __future__ import annotations

import threading
import time

import pytest
from cluster_data import COMMITTED, GROUP, SENT_PER_QUEUE, TOPIC, ClusterData
from console_helpers import Browser, ConsoleProcess

from gms.client import Admin, Producer, ProducerRecord

pytestmark = pytest.mark.timeout(60)

LIVE_TOPIC = "clicks"
LIVE_RATE_MESSAGES_PER_S = 100


def test_cluster_page(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    page.open(console.url("/"))
    brokers = page.rows("brokers")
    assert [(b["address"], b["alive"], b["store"]) for b in brokers] == [(data.broker, "yes", "writable")]
    with Admin(nameserver=data.nameserver) as admin:
        topics = len(admin.topics())
    assert page.text("#topic-count") == str(topics)
    assert page.text("#broker-count") == "1" and page.text("#nameserver-count") == "1"
    assert page.text("#problems") == "Healthy: no problems found"
    [nameserver] = page.rows("nameservers")
    assert nameserver["address"] == data.nameserver and nameserver["controller"].startswith("yes (epoch")
    [etcd] = page.rows("etcd")
    assert etcd["healthy"] == "yes" and etcd["version / error"].startswith("3.")
    page.screenshot("cluster")


def test_topics_page(page: Browser, console: ConsoleProcess) -> None:
    page.open(console.url("/topics"))
    rows = {r["topic"]: r for r in page.rows("topics")}
    assert rows[TOPIC]["queues"] == str(len(SENT_PER_QUEUE))
    assert rows[TOPIC]["messages"] == str(sum(SENT_PER_QUEUE))
    assert page.text("#read-only").startswith("Read-only console")
    page.screenshot("topics")


def test_topic_page_shows_queues_and_chart(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    page.open(console.url(f"/topics/{TOPIC}"))
    queues = page.rows("queues")
    assert [(q["queue"], q["leader"], q["min offset"], q["max offset"], q["messages"]) for q in queues] == [
        (str(q), data.broker, "0", str(n), str(n)) for q, n in enumerate(SENT_PER_QUEUE)]
    assert all(q["ISR"] == f"1 of 1 in sync {data.broker}" and q["replicas"] == data.broker for q in queues)
    assert page.text("#messages") == str(sum(SENT_PER_QUEUE))
    page.wait_for(lambda: page.chart_points("#rate-chart") >= 1, "the rate chart's first point")
    page.screenshot("topic")


def test_topic_rate_chart_is_live(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    """Messages sent while the page is open show as a rate above zero, and the count catches up."""
    with Admin(nameserver=data.nameserver) as admin:
        admin.create_topic(LIVE_TOPIC, 2)
    stop = threading.Event()
    sent = 0

    def produce() -> None:
        nonlocal sent
        with Producer(nameserver=data.nameserver) as producer:
            while not stop.is_set():
                producer.send_batch([ProducerRecord(LIVE_TOPIC, b"click")] * (LIVE_RATE_MESSAGES_PER_S // 10))
                sent += LIVE_RATE_MESSAGES_PER_S // 10
                time.sleep(0.1)

    producer = threading.Thread(target=produce, name="live-producer")
    producer.start()
    try:
        page.open(console.url(f"/topics/{LIVE_TOPIC}"))
        page.wait_for(lambda: _rate(page.text("#rate")) > 0, "a rate above zero")
        page.wait_for(lambda: page.chart_points("#rate-chart") >= 2, "two points on the rate chart")
        page.screenshot("topic-live")
    finally:
        stop.set()
        producer.join()
    page.wait_for(lambda: page.text("#messages") == str(sent), f"the count to reach the {sent} sent")


def _rate(text: str) -> float:
    return float(text.removesuffix("/s")) if text.endswith("/s") else 0.0


def test_groups_page(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    page.open(console.url("/groups"))
    rows = {r["group"]: r for r in page.rows("groups")}
    assert (rows[GROUP]["members"], rows[GROUP]["lag"]) == ("1", str(data.total_lag))
    page.screenshot("groups")


def test_group_page_shows_members_lag_and_chart(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    page.open(console.url(f"/groups/{GROUP}"))
    assert page.text("#total-lag") == str(data.total_lag)
    [member] = page.rows("members")
    assert member["member"] == data.member and member["mode"] == "clustering"
    held = member["queues held"].split(", ")  # the topic's queues, and the group's retry queue
    assert held == [f"%RETRY%{GROUP}/0", *(f"{TOPIC}/{q}" for q in range(len(SENT_PER_QUEUE)))]
    lag = page.rows("lag")
    assert [(r["topic"], r["queue"], r["broker"], r["member"], r["committed"], r["max offset"], r["lag"])
            for r in lag if r["topic"] == TOPIC] == [
        (TOPIC, str(q), data.broker, data.member, str(COMMITTED[q]) if q in COMMITTED else "-", str(n),
         str(data.lag(q)))
        for q, n in enumerate(SENT_PER_QUEUE)]
    page.wait_for(lambda: page.chart_points("#lag-chart") >= 1, "the lag chart's first point")
    page.screenshot("group")


def test_message_lookup_by_id(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    sent = data.sent[SENT_PER_QUEUE[0] + 2]  # queue 1, offset 2
    page.open(console.url(f"/messages?id={sent.msg_id}"))
    page.wait_for(lambda: page.js("return document.getElementById('result').dataset.state") == "found",
                  "the message")
    fields = {r["field"]: r["value"] for r in page.rows("message")}
    assert (fields["message id"], fields["topic"], fields["queue"], fields["queue offset"]) == (
        sent.msg_id, TOPIC, "1", "2")
    assert (fields["broker"], fields["tag"], fields["keys"], fields["properties"]) == (
        data.broker, "created", "o-1-2", "source=console-test")
    assert fields["stored"].startswith(time.strftime("%Y-"))
    assert page.text("#body") == "order 1-2"
    page.screenshot("message")


def test_message_lookup_by_key(page: Browser, console: ConsoleProcess, data: ClusterData) -> None:
    sent = data.sent[SENT_PER_QUEUE[0] + 2]  # queue 1, offset 2, key o-1-2
    page.open(console.url(f"/messages?topic={TOPIC}&key=o-1-2"))
    page.wait_for(lambda: page.js("return document.getElementById('result').dataset.state") == "found",
                  "the messages with the key")
    rows = page.rows("matches")
    assert [(r["message id"], r["queue"], r["offset"], r["tag"], r["body"]) for r in rows] == [
        (sent.msg_id, "1", "2", "created", "order 1-2")]
    page.screenshot("message-by-key")
    page.open(console.url(f"/messages?topic={TOPIC}&key=nobody-has-it"))
    page.wait_for(lambda: page.js("return document.getElementById('result').dataset.state") == "found",
                  "an empty answer")
    assert page.text("#result h2").startswith("0 message(s)")


def test_message_lookup_explains_unknown_and_malformed_ids(page: Browser, console: ConsoleProcess,
                                                           data: ClusterData) -> None:
    page.open(console.url("/messages"))
    unknown = data.sent[0].msg_id[:-16] + "7FFFFFFF00000000"  # the broker's address, an offset never written
    for msg_id, expected in ((unknown, f"no message with id {unknown} on broker {data.broker}"),
                             ("not-an-id", "is not hexadecimal")):
        page.driver.find_element("id", "msg-id").clear()
        page.driver.find_element("id", "msg-id").send_keys(msg_id)
        page.driver.find_element("css selector", "#lookup button").click()
        page.wait_for(lambda: page.js("return document.getElementById('result').dataset.state") == "error",
                      "the lookup to fail")
        assert expected in page.text("#result .error")
        if msg_id == unknown:
            page.screenshot("message-not-found")
