"""The broker's monitoring endpoint on a real broker process: /healthz, /readyz and /metrics in
Prometheus' text format, with what was stored and served per topic, request latencies per code
and status, and the consumer group's lag and its age."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from processes import free_port
from prometheus_client.parser import text_string_to_metric_families

from gms.client import Admin, Consumer, Producer, ProducerRecord

pytestmark = pytest.mark.timeout(60)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_metrics_health_and_readiness_of_a_standalone_broker(broker_factory):
    port = free_port()
    broker = broker_factory("--metrics-listen", f"127.0.0.1:{port}")
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    with Admin([broker.address]) as admin:
        admin.create_topic("watched", queues=2)
    with Producer([broker.address]) as producer:
        producer.send_batch([ProducerRecord("watched", b"x" * 100, queue=0)] * 30)
    consumer = Consumer([broker.address], group="watchers", subscription={"watched": "*"}, start_from="first",
                        max_poll_messages=10, auto_commit=False)
    try:
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 30 and time.monotonic() < deadline:
            got += consumer.poll(200)
        consumer.commit({("watched", 0): 10})  # 20 of queue 0 left for the group
    finally:
        consumer.close()
    time.sleep(1.1)  # the messages grow a little older
    metrics = scrape(port)
    topic = (("topic", "watched"),)
    assert metrics["gms_broker_messages_in_total", topic] == 30
    assert metrics["gms_broker_messages_out_total", topic] >= 30
    assert metrics["gms_broker_bytes_in_total", topic] > 30 * 100
    sends = [v for (name, labels), v in metrics.items() if name == "gms_broker_request_seconds_count"
             and dict(labels) == {"code": "SEND_BATCH", "status": "SUCCESS"}]
    assert sends == [1]
    lag = (("group", "watchers"), ("queue", "0"), ("topic", "watched"))
    assert metrics["gms_broker_group_lag_messages", lag] == 20
    assert metrics["gms_broker_group_lag_seconds", lag] >= 1
    assert metrics["gms_broker_connections", ()] >= 0
    assert metrics["gms_broker_store_health", (("state", "writable"),)] == 1
    assert get(port, "/nothing-here")[0] == 404
