"""Batch reads of a store written by the real engine: values, filters, offsets, corruption."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from pyspark.sql import functions as F
from spark_store_helpers import MANY_QUEUES, ORDERS, store_config

from gms.broker.store import MessageStore
from gms.msgid import decode_msg_id
from gms.record import encode_record
from gms.record.layout import DELIVER_AT_PROPERTY, FLAG_SCHEDULED

BROKER_ADDRESS = "10.9.8.7:10911"


def gms(spark, **options):
    reader = spark.read.format("gms")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader


def test_rows_match_what_was_produced(spark, store):
    base, sent = store
    rows = gms(spark, topics="orders", brokerAddress=BROKER_ADDRESS).load(str(base)).collect()
    assert len(rows) == ORDERS
    for row in rows:
        i = row.queue_offset * 4 + row.queue_id  # appended in order, round-robin over 4 queues
        m = sent[i]
        assert (row.topic, bytes(row.body), row.tag) == ("orders", m.body, m.tag)
        assert row.keys == list(m.keys)
        assert row.properties == dict(m.properties or {})
        assert row.born_host == m.born_host and row.reconsume_times == m.reconsume_times
        assert int(row.born_timestamp.timestamp() * 1000) == m.born_ts_ms
        assert row.size > len(m.body)
        assert decode_msg_id(row.msg_id) == ("10.9.8.7", 10911, row.commit_log_offset)
    offsets = sorted((r.queue_id, r.queue_offset) for r in rows)
    assert offsets == sorted((q, o) for q in range(4) for o in range(ORDERS // 4))

    without_address = gms(spark, topics="orders", columns="msg_id,tag").load(str(base))
    assert without_address.columns == ["tag", "msg_id"]
    assert without_address.where(F.col("msg_id").isNotNull()).count() == 0
    assert gms(spark, topics="empty").load(str(base)).count() == 0
    many = gms(spark, topics="many", columns="queue_id,body").load(str(base))
    # Small queues share partitions: as many as local[2] runs at once, each queue read whole once.
    assert many.rdd.getNumPartitions() == 2
    assert sorted((r.queue_id, bytes(r.body)) for r in many.collect()) == [(q, b"m%d" % q) for q in range(MANY_QUEUES)]
    one_each = gms(spark, topics="many", columns="queue_id", minRecordsPerPartition="1").load(str(base))
    assert one_each.rdd.getNumPartitions() == MANY_QUEUES
    assert gms(spark).load(str(base)).count() == ORDERS + MANY_QUEUES
    split = gms(spark, topics="orders", columns="queue_offset", maxRecordsPerPartition="100",
                minRecordsPerPartition="300").load(str(base))
    assert split.rdd.getNumPartitions() == 4 and split.count() == ORDERS  # 4 queues x 3 ranges, 3 a partition
    assert sorted(r.queue_offset for r in split.collect()) == sorted(list(range(ORDERS // 4)) * 4)


def test_a_python_worker_freezes_its_heap_at_its_first_read(store):
    """PySpark's daemon runs a full gc.collect() after every task of a reused Python worker: a
    worker's first gms read moves what it holds then (its modules) out of that collection's
    reach, once (later reads' objects stay collectable)."""
    base, _ = store
    code = textwrap.dedent(f"""
        import gc
        from gms.spark_jobs.datasource import _read
        from gms.spark_jobs.options import parse_options
        from gms.spark_jobs.partitions import QueueRange, QueueRanges
        options = parse_options({{"path": {str(base)!r}, "topics": "orders"}})
        before = gc.get_freeze_count()
        rows = sum(b.num_rows for b in _read(QueueRanges((QueueRange("orders", 0, 0, 10),)), options,
                                             ("queue_offset",), None))
        frozen = gc.get_freeze_count()
        list(_read(QueueRanges((QueueRange("orders", 1, 0, 10),)), options, ("queue_offset",), None))
        print(before, rows, frozen > 0, gc.get_freeze_count() == frozen)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "10", "True", "True"]


def test_tag_time_and_offset_filters(spark, store):
    base, sent = store
    path = str(base)
    assert {r.tag for r in gms(spark, tags="paid", columns="tag").load(path).collect()} == {"paid"}
    paid = gms(spark, tags="paid", topics="orders", columns="tag").load(path)
    assert paid.count() == sum(m.tag == "paid" for m in sent)
    tagged = gms(spark, tags="paid || created", topics="orders").load(path)
    assert tagged.count() == sum(m.tag is not None for m in sent)

    stamps = sorted({r.ms for r in gms(spark, topics="orders", columns="store_timestamp").load(path)
                    .select(F.unix_millis("store_timestamp").alias("ms")).collect()})
    assert len(stamps) > 3
    lo, hi = stamps[1], stamps[-2]
    df = (gms(spark, topics="orders", columns="store_timestamp").load(path)
          .select(F.unix_millis("store_timestamp").alias("ms")))
    expected = df.where((F.col("ms") >= lo) & (F.col("ms") < hi)).count()
    got = gms(spark, topics="orders", startTime=str(lo), endTime=str(hi)).load(path)
    assert 0 < got.count() == expected

    starting = json.dumps({"orders": {"0": 10, "2": 295}})
    ending = json.dumps({"orders": {"0": 20, "1": 0, "3": 5}})
    sliced = gms(spark, topics="orders", columns="queue_id,queue_offset", startingOffsets=starting,
                 endingOffsets=ending).load(path).collect()
    assert sorted((r.queue_id, r.queue_offset) for r in sliced) == (
        [(0, o) for o in range(10, 20)] + [(2, o) for o in range(295, 300)] + [(3, o) for o in range(5)])


def _flip_body_byte(store_dir, phys: int) -> None:
    """Flip a byte near the end of the record at commitlog offset ``phys`` (inside its body)."""
    files = sorted((store_dir / "commitlog").iterdir())
    size = files[0].stat().st_size
    path = files[phys // size]
    with open(path, "r+b") as f:
        f.seek(phys % size)
        total = int.from_bytes(f.read(4), "big")
        f.seek(phys % size + total - 1)
        byte = f.read(1)
        f.seek(phys % size + total - 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_corrupt_record_is_skipped_and_counted_or_fails(spark, store, tmp_path):
    base, _ = store
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    victim = gms(spark, topics="orders", startingOffsets=json.dumps({"orders": {"1": 7}}),
                 endingOffsets=json.dumps({"orders": {"0": 0, "1": 8, "2": 0, "3": 0}})).load(str(copy)).collect()
    assert len(victim) == 1
    _flip_body_byte(copy / "store", victim[0].commit_log_offset)
    before = spark.gms_corrupt.value
    rows = gms(spark, topics="orders", columns="queue_id,queue_offset").load(str(copy)).collect()
    assert len(rows) == ORDERS - 1 and (1, 7) not in {(r.queue_id, r.queue_offset) for r in rows}
    assert spark.gms_corrupt.value == before + 1
    with pytest.raises(Exception, match="corrupt record"):
        gms(spark, topics="orders", onCorrupt="fail").load(str(copy)).count()


def test_scheduled_messages_not_yet_delivered_are_not_read(spark, tmp_path):
    """A scheduled message is hidden in its queue until the broker appends its delivered copy:
    a store read sees what consumers see."""
    root = tmp_path / "sched"
    store = MessageStore.open(root, store_config())
    store.create_topic("sched", 1)
    store.append(encode_record(topic="sched", body=b"visible"))
    store.append(encode_record(topic="sched", body=b"hidden", flags=FLAG_SCHEDULED,
                               properties={DELIVER_AT_PROPERTY: str(int(time.time() * 1000) + 3_600_000)}))
    store.close()
    assert [bytes(r.body) for r in gms(spark, topics="sched").load(str(root)).collect()] == [b"visible"]


def test_a_compacted_queue_reads_its_compacted_log_then_the_rest(spark, tmp_path):
    """Below the compaction point a store read gets the kept records (the latest per key) at their
    offsets, as consumers do, then every record from the point on."""
    from gms.broker.store.topic_table import TopicLimits
    from gms.record import Message, encode_batch

    root = tmp_path / "compacted"
    store = MessageStore.open(root, store_config())
    store.create_topic("c", 1, TopicLimits(cleanup_policy="compact", segment_roll_messages=10, dirty_ratio=0.0))
    store.append(encode_batch([Message("c", b"%d" % i, keys=(f"k{i % 5}",)) for i in range(104)]))
    assert store.compact() == 1
    store.close()
    rows = gms(spark, topics="c").load(str(root)).collect()
    assert [(r.queue_offset, bytes(r.body)) for r in rows] == [(i, b"%d" % i) for i in (*range(95, 100), 100,
                                                                                         101, 102, 103)]
    later = gms(spark, topics="c", startingOffsets=json.dumps({"c": {"0": 97}})).load(str(root)).collect()
    assert [r.queue_offset for r in later] == [97, 98, 99, 100, 101, 102, 103]
