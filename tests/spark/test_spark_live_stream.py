"""A live broker read, reading a store while its broker runs, and streaming resume."""

from __future__ import annotations

import shutil

from spark_store_helpers import MANY_QUEUES, ORDERS, broker_on_copy, store_config

from gms.broker.store import MessageStore
from gms.msgid import decode_msg_id
from gms.record import Message, encode_batch


def test_live_broker_read_and_store_read_while_running(spark, store, tmp_path, broker_factory):
    base, sent = store
    broker = broker_on_copy(base, tmp_path, broker_factory)
    live = (spark.read.format("gms").option("brokers", broker.address).option("topics", "orders")
            .option("tags", "paid").load().collect())
    paid = [m for m in sent if m.tag == "paid"]
    assert sorted(bytes(r.body) for r in live) == sorted(m.body for m in paid)
    host, port = broker.address.split(":")
    assert all(decode_msg_id(r.msg_id) == (host, int(port), r.commit_log_offset) for r in live)
    assert all(r.keys == list(sent[r.queue_offset * 4 + r.queue_id].keys) for r in live)

    running = spark.read.format("gms").option("columns", "topic").load(str(broker.store_dir))
    assert running.count() == ORDERS + MANY_QUEUES  # read-only: no abort marker taken, nothing written
    assert broker.proc.poll() is None


def _append(root, first: int, count: int) -> None:
    with MessageStore(root, store_config()) as store:
        late = [Message("orders", b"late-%d" % i, queue_id=i % 4) for i in range(first, first + count)]
        store.append(encode_batch(late))


def test_stream_resumes_from_checkpoint_without_duplicates_or_gaps(spark, store, tmp_path):
    base, _ = store
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_once() -> None:
        query = (spark.readStream.format("gms").option("topics", "orders")
                 .option("columns", "queue_id,queue_offset,body").load(str(copy))
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None

    run_once()
    assert spark.read.parquet(str(out)).count() == ORDERS
    _append(copy / "store", 0, 100)
    run_once()
    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.queue_id, r.queue_offset) for r in rows]
    assert len(keys) == len(set(keys)) == ORDERS + 100
    assert sorted(keys) == sorted((q, o) for q in range(4) for o in range((ORDERS + 100) // 4))
