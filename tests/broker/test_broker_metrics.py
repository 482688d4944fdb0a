"""The broker's monitoring endpoint on a real broker process: /healthz, /readyz and /metrics in
Prometheus' text format, with what was stored and served per topic, request latencies per code
and status, and the consumer group's lag and its age."""

from __future__ import annotations

import time

import pytest
from processes import free_port
from scrape import get, scrape

from gms.client import Admin, Consumer, Producer, ProducerRecord

pytestmark = pytest.mark.timeout(60)


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


def test_lag_follows_the_group_subscription_and_the_store_times_its_work(broker_factory, tmp_path):
    """Tag-aware lag, send-to-ack latency by acks, flush timings, the page-cache ratio,
    rebalances, and per-queue counters (``metrics_per_queue``) on a sync-flush broker."""
    port = free_port()
    config = tmp_path / "broker.toml"
    config.write_text("[broker]\nmetrics_per_queue = true\n")
    broker = broker_factory("--metrics-listen", f"127.0.0.1:{port}", "--flush", "sync", "--config", str(config))
    with Admin([broker.address]) as admin:
        admin.create_topic("tagged", queues=1)
    with Producer([broker.address]) as producer:
        records = [ProducerRecord("tagged", b"m", tag="red" if i % 4 == 0 else "blue", queue=0) for i in range(40)]
        producer.send_batch(records)
        producer.send("tagged", b"one", tag="red", queue=0)
    consumer = Consumer([broker.address], group="reds", subscription={"tagged": "red"}, start_from="first",
                        max_poll_messages=4, auto_commit=False)
    try:
        got = consumer.poll(2000)
        assert got and all(m.tag == "red" for m in got)
        consumer.commit({("tagged", 0): got[-1].queue_offset + 1})
        consumed_reds = len(got)
    finally:
        consumer.close()
    metrics = scrape(port)
    lag = (("group", "reds"), ("queue", "0"), ("topic", "tagged"))
    assert metrics["gms_broker_group_lag_messages", lag] == 11 - consumed_reds  # reds only, not the 30 blues
    per_queue = (("queue", "0"), ("topic", "tagged"))
    assert metrics["gms_broker_messages_in_total", per_queue] == 41
    assert metrics["gms_broker_send_ack_seconds_count", (("acks", "1"),)] == 2
    assert metrics["gms_broker_flush_seconds_count", ()] >= 1
    assert metrics["gms_broker_flush_errors_total", ()] == 0
    assert metrics["gms_broker_retention_deleted_files_total", ()] == 0
    assert 0 < metrics["gms_broker_commitlog_resident_ratio", ()] <= 1
    assert metrics["gms_broker_group_rebalances_total", (("group", "reds"),)] >= 1
    assert metrics["gms_broker_sends_waiting_bytes", ()] == 0
