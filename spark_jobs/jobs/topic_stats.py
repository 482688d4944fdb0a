"""topic-stats: messages and bytes per topic, queue and tag per time bucket, and the busiest keys.

    python -m gms.spark_jobs.jobs.topic_stats --store /var/lib/gms/broker0 --bucket hour --output stats/
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from gms.spark_jobs.jobs.common import master_option, read_log, source_options, spark_session

BUSIEST_KEYS_DEFAULT = 10
SHOWN_ROWS_MAX = 50


def bucket_counts(log: DataFrame, bucket: str) -> DataFrame:
    """messages and bytes per (topic, queue_id, tag, bucket start)."""
    return (log.withColumn("bucket", F.date_trunc(bucket, "store_timestamp"))
            .groupBy("topic", "queue_id", "tag", "bucket")
            .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"))
            .orderBy("topic", "queue_id", "tag", "bucket"))


def busiest_keys(log: DataFrame, top: int) -> DataFrame:
    """The ``top`` keys with the most messages per topic."""
    per_key = (log.select("topic", F.explode("keys").alias("key")).groupBy("topic", "key")
               .agg(F.count("*").alias("messages")))
    rank = F.row_number().over(Window.partitionBy("topic").orderBy(F.desc("messages"), "key"))
    return per_key.withColumn("rank", rank).where(F.col("rank") <= top).orderBy("topic", "rank")


@click.command("topic-stats")
@master_option
@source_options
@click.option("--bucket", type=click.Choice(["minute", "hour"]), default="minute", show_default=True)
@click.option("--top-keys", type=int, default=BUSIEST_KEYS_DEFAULT, show_default=True)
@click.option("--output", type=click.Path(file_okay=False), help="Write buckets/ and keys/ here.")
@click.option("--format", "output_format", type=click.Choice(["parquet", "csv"]), default="parquet",
              show_default=True)
def command(master: str | None, bucket: str, top_keys: int, output: str | None, output_format: str,
            **source: str | None) -> None:
    """Messages and bytes per topic, queue and tag per time bucket, with the busiest keys."""
    spark = spark_session("gms-topic-stats", master)
    log = read_log(spark, columns="topic,queue_id,tag,size,store_timestamp,keys", **source).cache()
    buckets, keys = bucket_counts(log, bucket), busiest_keys(log, top_keys)
    if output:
        for name, frame in (("buckets", buckets), ("keys", keys)):
            writer = frame.write.mode("overwrite")
            target = f"{output}/{name}"
            writer.option("header", "true").csv(target) if output_format == "csv" else writer.parquet(target)
    buckets.show(SHOWN_ROWS_MAX, truncate=False)
    keys.show(SHOWN_ROWS_MAX, truncate=False)
    log.unpersist()


def main(argv: Sequence[str] | None = None) -> None:
    command.main(args=list(argv) if argv is not None else None, prog_name="topic-stats")


if __name__ == "__main__":
    main()
