"""Compacted topics against real processes (embedded etcd, a nameserver, brokers whose cleaner
runs every 200 ms): ``gms topic create/update --cleanup`` and its checks, keyed messages
overwritten many times and tombstones read back from the start by PULL, ``gms tail`` and a Kafka
consumer, the
cleaner's /metrics (the replicated case: tests/ha/test_ha_compaction.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from compaction_cluster_helpers import CLEANER_TOML, KEYS, compacted, keyed, latest, read_from_start, read_records
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from gms_cluster import LocalCluster
from processes import free_port, wait_until
from scrape import scrape

from gms.client import Producer
from gms.record.layout import TOMBSTONE_PROPERTY

TIMEOUT_S = 60
pytestmark = pytest.mark.timeout(120)


def gms(nameserver: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], capture_output=True, text=True,
                            env={**os.environ, "GMS_NAMESERVER": nameserver}, timeout=TIMEOUT_S, check=False)
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode == 0) == ok, result.stderr
    return result


def kafka_read(bootstrap: str, topic: str, end: int) -> list[tuple[int, str, int | None]]:
    """(offset, key, value) of every record a Kafka consumer reads from the partition's start
    (None: a tombstone's null value)."""
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                              "enable.auto.commit": False})
    found: list[tuple[int, str, int | None]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + TIMEOUT_S
        while (not found or found[-1][0] < end - 1) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                value = message.value()
                found.append((message.offset(), message.key().decode(), None if value is None else int(value)))
    finally:
        consumer.close()
    return found


def kafka_tombstone(bootstrap: str, topic: str, key: str) -> None:
    """A Kafka producer's tombstone for ``key`` (a null value) on the partition."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=key.encode(), value=None, partition=0)
    assert producer.flush(TIMEOUT_S) == 0


def test_a_compacted_topic_through_the_cli_the_sdk_and_gms_tail(tmp_path):
    config = tmp_path / "cleaner.toml"
    config.write_text(CLEANER_TOML)
    metrics_port, kafka_port = free_port(), free_port()
    cluster = LocalCluster(tmp_path)
    try:
        cluster.etcd.start()
        cluster.add_nameserver()
        broker = cluster.add_broker("--config", str(config), "--metrics-listen", f"127.0.0.1:{metrics_port}",
                                    "--kafka-listen", f"127.0.0.1:{kafka_port}")
        cluster.wait_registered(1)
        ns, topic = cluster.nameserver, f"c-{uuid.uuid4().hex[:8]}"
        created = json.loads(gms(ns, "topic", "create", topic, "--queues", "1", "--cleanup", "compact",
                                 "--segment-roll-messages", "10", "--dirty-ratio", "0", "--json").stdout)
        assert created["settings"]["cleanup_policy"] == "compact"
        assert created["settings"]["segment_roll_messages"] == 10
        assert gms(ns, "topic", "update", topic, "--cleanup", "shrink", ok=False).returncode == 2
        assert gms(ns, "topic", "update", topic, "--dirty-ratio", "2", ok=False).returncode == 2
        with Producer(nameserver=ns) as producer:
            for first in range(0, 300, 50):  # each key overwritten ~23 times
                producer.send_batch(keyed(topic, first, 50))
        wait_until(lambda: time.sleep(0.2) or compacted(read_from_start(broker.address, topic), 300, 300), TIMEOUT_S)
        shown = gms(ns, "tail", topic, "--from", "first", "--count", str(KEYS), "--format", "json").stdout
        lines = [json.loads(line) for line in shown.splitlines()]
        assert {m["keys"][0]: int(m["body"]) for m in lines} == latest(300)
        assert all((TOMBSTONE_PROPERTY in m["properties"]) == (int(m["body"]) % 7 == 6) for m in lines)
        assert kafka_read(f"127.0.0.1:{kafka_port}", topic, 300) == [  # a tombstone is a null value
            (offset, key, None if seq % 7 == 6 else seq) for offset, key, seq in read_from_start(broker.address, topic)]
        bootstrap = f"127.0.0.1:{kafka_port}"
        kafka_tombstone(bootstrap, topic, "k0")
        assert kafka_read(bootstrap, topic, 301)[-1] == (300, "k0", None)
        stored = read_records(broker.address, topic, 300)[0]
        assert (stored.keys, bytes(stored.body), stored.properties) == (("k0",), b"", {TOMBSTONE_PROPERTY: "1"})
        metrics = scrape(metrics_port)
        assert metrics["gms_broker_compaction_reclaimed_bytes_total", ()] > 0
        assert metrics["gms_broker_compaction_last_run_timestamp_seconds", ()] > 0
        assert ("gms_broker_compaction_cleanable_ratio", ()) in metrics
        gms(ns, "topic", "update", topic, "--cleanup", "compact,delete")
        table = gms(ns, "topic", "describe", topic).stdout
        assert "compact,delete" in table and "10 messages" in table
    finally:
        cluster.stop()


def test_lookups_by_key_and_by_id_find_what_compaction_kept(tmp_path):
    """Once the commitlog files below the compaction point are deleted, ``gms msg find`` and
    ``gms msg show`` still find each key's kept record (in the compacted log), never one
    compaction removed."""
    config = tmp_path / "cleaner.toml"
    config.write_text(CLEANER_TOML + "retention_check_interval_ms = 200\n")
    cluster = LocalCluster(tmp_path)
    try:
        cluster.etcd.start()
        cluster.add_nameserver()
        broker = cluster.add_broker("--config", str(config), "--commitlog-file-size", str(16 * 1024))
        cluster.wait_registered(1)
        ns, topic = cluster.nameserver, f"c-{uuid.uuid4().hex[:8]}"
        gms(ns, "topic", "create", topic, "--queues", "1", "--cleanup", "compact", "--segment-roll-messages", "10",
            "--dirty-ratio", "0")
        with Producer(nameserver=ns) as producer:
            sent = [r.msg_id for first in range(0, 300, 50) for r in producer.send_batch(keyed(topic, first, 50))]
        commitlog = broker.store_dir / "store" / "commitlog"
        wait_until(lambda: time.sleep(0.2) or (compacted(read_from_start(broker.address, topic), 300, 300)
                                               and int(min(os.listdir(commitlog))) > 0), TIMEOUT_S)
        for key, seq in latest(300).items():
            found = json.loads(gms(ns, "msg", "find", "--topic", topic, "--key", key, "--json").stdout)
            assert [(m["queue_offset"], m["body"], m["msg_id"]) for m in found] == [(seq, str(seq), sent[seq])]
            shown = json.loads(gms(ns, "msg", "show", sent[seq], "--json").stdout)
            assert (shown["queue_offset"], shown["keys"], shown["body"]) == (seq, [key], str(seq))
        removed = next(seq for seq in range(300) if seq != latest(300)[f"k{seq % KEYS}"])
        assert "no message" in gms(ns, "msg", "show", sent[removed], ok=False).stderr
    finally:
        cluster.stop()
