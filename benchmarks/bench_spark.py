"""Rows/s through the gms Spark data source on local[2], from a store and from a live broker,
and into a live broker through the gms sink.

    python benchmarks/bench_spark.py            # 10 M 100-byte messages in 64 queues
    python benchmarks/bench_spark.py --quick    # 2 M messages (well under 300 s)

Prints one JSON line: ``rows_per_s`` (store read, full rows reduced on the executors),
``count_rows_per_s`` (count with column pruning), ``tag_rows_per_s`` (tag histogram over a pruned
schema), ``live_rows_per_s`` (the same full read through a running broker), ``sink_rows_per_s``
(as many 100-byte messages written by ``df.write.format("gms")`` into a topic of 64 queues on
that broker, every one acknowledged).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.client import Admin
from gms.record import Message, encode_batch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from processes import BrokerProcess

TOPIC = "bench"
SINK_TOPIC = "bench-sink"
QUEUES = 64
BODY_BYTES = 100
APPEND_BATCH = 4096
TAGS = ("created", "paid", "shipped", None)
STORE_CONFIG = StoreConfig(flush_interval_ms=1000)


def write_store(root: Path, messages: int) -> None:
    """Append ``messages`` 100-byte records round-robin over the queues (one encoded batch reused)."""
    store = MessageStore.open(root, STORE_CONFIG)
    store.create_topic(TOPIC, QUEUES)
    body = b"x" * BODY_BYTES
    batch = encode_batch([Message(TOPIC, body, tag=TAGS[i % len(TAGS)], keys=(f"k{i % 97}",),
                                  queue_id=i % QUEUES, born_host="10.0.0.1") for i in range(APPEND_BATCH)])
    for _ in range(messages // APPEND_BATCH):
        store.append(batch)
    store.close()


def timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int, default=None)
    args = parser.parse_args()
    messages = args.messages or (2_000_000 if args.quick else 10_000_000)
    messages -= messages % APPEND_BATCH

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from gms.spark_jobs import register

    with tempfile.TemporaryDirectory(prefix="gms-bench-spark-") as tmp:
        broker_dir = Path(tmp) / "broker"
        write_seconds, _ = timed(lambda: write_store(broker_dir / "store", messages))
        spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)

        def reader():  # DataFrameReader.option mutates the reader: take a fresh one each time
            return spark.read.format("gms")

        def full_read(df):  # every column built and shipped to the JVM, reduced there
            return df.agg(F.count("*"), F.sum(F.length("body")), F.max("queue_offset"), F.count("msg_id")).collect()

        store_df = reader().option("brokerAddress", "10.0.0.1:10911").load(str(broker_dir))
        full_read(store_df)  # warm: page cache, Python workers
        full_s, rows = timed(lambda: full_read(store_df))
        assert rows[0][0] == messages, rows
        count_s, counted = timed(lambda: reader().option("columns", "queue_offset").load(str(broker_dir)).count())
        assert counted == messages
        tags_df = reader().option("columns", "tag").load(str(broker_dir))
        tag_s, _ = timed(lambda: tags_df.groupBy("tag").count().collect())

        # The broker must open the store with the file sizes it was written with.
        size_flags = ["--commitlog-file-size", str(STORE_CONFIG.commitlog_file_size_bytes),
                      "--cq-file-entries", str(STORE_CONFIG.cq_entries_per_file)]
        broker = BrokerProcess(broker_dir, size_flags).start()
        try:
            live_df = reader().option("brokers", broker.address).load()
            live_s, live_rows = timed(lambda: full_read(live_df))
            assert live_rows[0][0] == messages, live_rows
            with Admin(brokers=[broker.address]) as admin:
                admin.create_topic(SINK_TOPIC, QUEUES)
            bodies = spark.range(messages, numPartitions=2).select(
                F.expr(f"cast(repeat('x', {BODY_BYTES}) as binary)").alias("body"))
            sink_s, _ = timed(lambda: bodies.write.format("gms").mode("append").option("brokers", broker.address)
                              .option("topic", SINK_TOPIC).save())
            stored = reader().option("brokers", broker.address).option("topics", SINK_TOPIC).option(
                "columns", "queue_offset").load().count()
            assert stored == messages, stored
        finally:
            broker.stop()
            spark.stop()
    print(json.dumps({
        "messages": messages, "queues": QUEUES, "body_bytes": BODY_BYTES, "master": "local[2]",
        "write_s": round(write_seconds, 2),
        "rows_per_s": round(messages / full_s), "count_rows_per_s": round(messages / count_s),
        "tag_rows_per_s": round(messages / tag_s), "live_rows_per_s": round(messages / live_s),
        "sink_rows_per_s": round(messages / sink_s),
        "cores": len(os.sched_getaffinity(0)),
    }))


if __name__ == "__main__":
    main()
