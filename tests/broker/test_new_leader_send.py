"""A send to a queue whose new leader has not written its epoch yet waits for the write (the
broker holds it, bounded by its send timeout), rather than failing a producer whose few quick
retries run out before a slow disk finishes (seen in CI: a leader's epoch took > 600 ms)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Producer
from gms.errors import NotLeaderError, TopicNotFoundError

SEND_TIMEOUT_MS = 2000


@pytest.fixture
def cluster(tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text(f"[broker]\nsend_timeout_ms = {SEND_TIMEOUT_MS}\n")
    running = LocalCluster(tmp_path).start(nameservers=1, brokers=0)
    running.add_broker("--config", str(config))
    running.wait_registered(1)
    yield running
    running.stop()


def _block_epoch_writes(cluster: LocalCluster) -> Path:
    """A directory where the replication state file's temporary copy goes: every write of the
    file fails (OSError, also for root) until it is removed; the broker retries each second."""
    state = cluster.brokers[0].store_dir / "store" / "config" / "replication.json"
    blocker = state.with_name(state.name + ".tmp")
    blocker.mkdir()
    return blocker


def _refused_for_its_epoch(producer: Producer, topic: str) -> float:
    """Send to ``topic`` (a moment after its creation) until the broker answers for the epoch it
    could not write, not for a topic or leadership it has not taken yet; that answer's wait."""
    deadline = time.monotonic() + 20
    while True:
        started = time.monotonic()
        try:
            producer.send(topic, b"never stored")
        except (NotLeaderError, TopicNotFoundError) as err:
            if "is being written" in str(err):
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        else:
            raise AssertionError(f"a send to {topic} was stored while its epoch could not be written")


def test_a_send_waits_for_the_new_leaders_epoch_and_fails_clearly_past_the_send_timeout(cluster):
    with Producer(nameserver=cluster.nameserver, retries=0, request_timeout_ms=10_000) as producer:
        blocker = _block_epoch_writes(cluster)
        with Admin(nameserver=cluster.nameserver) as admin:
            admin.create_topic("slow-epoch", queues=1)
        held = _refused_for_its_epoch(producer, "slow-epoch")
        assert held >= SEND_TIMEOUT_MS / 1000 * 0.9  # held, not refused at once

        outcome: dict[str, object] = {}

        def send() -> None:
            try:
                outcome["result"] = producer.send("slow-epoch", b"stored once written")
            except Exception as err:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = err

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.5)
        assert not outcome, "the send was answered before the epoch was written"
        shutil.rmtree(blocker)
        sender.join(10)
        assert "error" not in outcome, outcome
        assert outcome["result"].queue_offset == 0


def test_a_send_right_after_a_burst_of_creations_waits_for_the_broker_to_take_its_queue(cluster):
    """A topic's create call returns once the cluster placed it; the broker takes its queues a
    moment later (seconds after a burst of creations on a busy host). A send meanwhile, to a
    queue the cluster placed here, waits for it rather than failing a producer whose retries
    run out first (seen: sends of a benchmark right after 1,000 creations failed). Each request
    names queues of many topics, some led already and some not: it waits for those it names."""
    names = [f"burst-{i:03d}" for i in range(300)]
    with Admin(nameserver=cluster.nameserver) as admin:
        assert not [r for r in admin.create_topics([(name, 4) for name in names]) if r.error]
    with Producer(nameserver=cluster.nameserver, retries=0, request_timeout_ms=10_000) as producer:
        futures = [producer.send_async(name, b"first", queue=queue)
                   for queue in (3, 0, 2, 1) for name in reversed(names)]
        producer.flush()
        assert [f.result(30).queue_offset for f in futures] == [0] * len(futures)
