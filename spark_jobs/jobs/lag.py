"""lag: per consumer group and queue, the committed offset against the queue's end, and the age
of the oldest message the group has not consumed yet.

Committed offsets come from the store's ``config/consumer_offsets.json`` (the broker persists it
every few seconds), so this job reads a store directory.

    python -m gms.spark_jobs.jobs.lag --store /var/lib/gms/broker0 [--group billing]
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gms.spark_jobs.datasource import SOURCE_NAME
from gms.spark_jobs.jobs.common import master_option, offsets_json, spark_session
from gms.spark_jobs.store_files import queue_index, read_consumer_offsets, read_topics, store_root

LAG_SCHEMA = ("group string, topic string, queue_id int, committed_offset bigint, max_offset bigint, "
              "lag bigint")


def lag_table(spark: SparkSession, store: str, groups: Sequence[str] = ()) -> DataFrame:
    """One row per (group, topic, queue) the group committed on, with the oldest unconsumed
    message's store time and age (null when the group is caught up)."""
    root = store_root(store)
    topics = read_topics(root)
    committed = read_consumer_offsets(root)
    rows, oldest = [], []
    for group, per_topic in sorted(committed.items()):
        if groups and group not in groups:
            continue
        starts: dict[str, dict[int, int]] = {}
        ends: dict[str, dict[int, int]] = {}
        for topic, queues in sorted(per_topic.items()):
            if topic not in topics:
                continue  # deleted since the group committed
            for queue_id, offset in sorted(queues.items()):
                high = queue_index(root, topic, queue_id).max_offset
                rows.append((group, topic, queue_id, offset, high, max(high - offset, 0)))
                if offset < high:
                    starts.setdefault(topic, {})[queue_id] = offset
                    ends.setdefault(topic, {})[queue_id] = offset + 1
        if starts:
            oldest.append(spark.read.format(SOURCE_NAME).option("topics", ",".join(starts))
                          .option("columns", "topic,queue_id,store_timestamp")
                          .option("startingOffsets", offsets_json(starts))
                          .option("endingOffsets", offsets_json(_others_empty(topics, starts, ends)))
                          .load(str(root)).withColumn("group", F.lit(group)))
    table = spark.createDataFrame(rows, LAG_SCHEMA)
    if not oldest:
        return table.withColumn("oldest_unconsumed", F.lit(None).cast("timestamp")) \
                    .withColumn("oldest_age_ms", F.lit(None).cast("bigint"))
    first = oldest[0]
    for frame in oldest[1:]:
        first = first.unionByName(frame)
    now_ms = int(time.time() * 1000)
    ages = first.select("group", "topic", "queue_id", F.col("store_timestamp").alias("oldest_unconsumed"),
                        (F.lit(now_ms) - F.unix_millis("store_timestamp")).alias("oldest_age_ms"))
    return table.join(ages, ["group", "topic", "queue_id"], "left").orderBy("group", "topic", "queue_id")


def _others_empty(topics: dict[str, int], starts: dict[str, dict[int, int]],
                  ends: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
    """End offsets that read one message from each lagging queue and nothing from the others."""
    return {topic: {q: ends[topic].get(q, 0) if q in starts[topic] else 0 for q in range(topics[topic])}
            for topic in starts}


@click.command("lag")
@master_option
@click.option("--store", required=True, type=click.Path(exists=True, file_okay=False),
              help="A broker's --store-dir (or its store/ folder).")
@click.option("--group", "groups", multiple=True, help="Only these groups (repeatable).")
@click.option("--output", type=click.Path(file_okay=False), help="Also write the table as Parquet here.")
def command(master: str | None, store: str, groups: tuple[str, ...], output: str | None) -> None:
    """Consumer-group lag per queue and the age of the oldest unconsumed message."""
    spark = spark_session("gms-lag", master)
    table = lag_table(spark, store, groups)
    if output:
        table.write.mode("overwrite").parquet(output)
    table.show(1000, truncate=False)


def main(argv: Sequence[str] | None = None) -> None:
    command.main(args=list(argv) if argv is not None else None, prog_name="lag")


if __name__ == "__main__":
    main()
