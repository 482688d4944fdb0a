"""Delete a topic, create it again, crash: the old incarnation's records (still in the shared
commitlog) never appear in the new one -- not after a crash recovery, not after a full index
rebuild, not in a broker killed with SIGKILL."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from gms.broker.store import MessageStore
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store_config import StoreConfig
from gms.client import Admin, Consumer, Producer
from gms.record import Message, decode_record, encode_batch

CONFIG = {"commitlog_file_size_bytes": 1 << 20, "cq_entries_per_file": 1000, "flush_interval_ms": 20,
          "retention_check_interval_ms": 60_000, "checkpoint_interval_ms": 3_600_000, "warm_next_file": False}


def batch(prefix: str, n: int) -> bytes:
    return encode_batch([Message("t", b"%s-%d" % (prefix.encode(), i)) for i in range(n)])


def bodies(store: MessageStore) -> list[bytes]:
    return [bytes(decode_record(v).body) for v in store.get("t", 0, 0, 1000).records]


def crash_with_no_checkpoint(root: Path) -> None:
    (root / CHECKPOINT_FILE).unlink()
    (root / ABORT_FILE).write_bytes(b"")


def test_recovery_indexes_only_the_new_incarnation(tmp_path):
    root = tmp_path / "store"
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        store.create_topic("t", 1)
        store.append(batch("old", 50))
        store.delete_topic("t")
        store.create_topic("t", 1)
        store.append(batch("new", 10))
    crash_with_no_checkpoint(root)
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        assert bodies(store) == [b"new-%d" % i for i in range(10)]
        assert store.append(batch("next", 1)).queue_offsets.tolist() == [10]


def test_full_index_rebuild_indexes_only_the_new_incarnation(tmp_path):
    root = tmp_path / "store"
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        store.create_topic("t", 1)
        store.append(batch("old", 50))
        store.delete_topic("t")
        store.create_topic("t", 1)
        store.append(batch("new", 10))
    shutil.rmtree(root / "consumequeue")  # every index lost: rebuilt from the whole commitlog
    crash_with_no_checkpoint(root)
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        assert bodies(store) == [b"new-%d" % i for i in range(10)]


def test_recovery_skips_a_deleted_topic_beside_kept_ones(tmp_path):
    # Records of a deleted topic and of a kept one, interleaved in the commitlog: recovery indexes
    # the kept ones (it failed to start: the deleted topic's name was looked up for the grouping).
    root = tmp_path / "store"
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        store.create_topics({"t": (1, TopicLimits()), "k": (1, TopicLimits())})
        for i in range(5):
            store.append(encode_batch([Message("t", b"gone-%d" % i)]))
            store.append(encode_batch([Message("k", b"kept-%d" % i)]))
        store.delete_topic("t")
    crash_with_no_checkpoint(root)
    with MessageStore(root, StoreConfig(**CONFIG)) as store:
        assert store.topics() == {"k": 1}
        assert [bytes(decode_record(v).body) for v in store.get("k", 0, 0, 100).records] == [
            b"kept-%d" % i for i in range(5)]


def test_broker_killed_after_delete_and_recreate(broker_factory):
    broker = broker_factory("--flush", "sync")
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin([broker.address]) as admin, Producer([broker.address]) as producer:
        admin.create_topic(topic, queues=2)
        producer.send_batch([{"topic": topic, "body": b"old-%d" % i} for i in range(200)])
        admin.delete_topic(topic)
        admin.create_topic(topic, queues=2)
        producer.send_batch([{"topic": topic, "body": b"new-%d" % i} for i in range(20)])
    broker.kill()
    broker.restart()
    with Consumer([broker.address], group=f"g-{uuid.uuid4().hex[:8]}", subscription={topic: "*"},
                  start_from="first") as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got += [bytes(m.body) for m in consumer.poll(200)]
        time.sleep(0.5)
        got += [bytes(m.body) for m in consumer.poll(200)]  # nothing more: no old record came back
    assert sorted(got) == sorted(b"new-%d" % i for i in range(20))
