"""export: a topic slice (tags, time) to Parquet partitioned by topic and date, for downstream use.

    python -m gms.spark_jobs.jobs.export --store /var/lib/gms/broker0 --topics orders \\
        --tags paid --start-time 2025-01-01 --output /data/orders
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gms.spark_jobs.jobs.common import master_option, read_log, source_options, spark_session

PARTITION_COLUMNS = ("topic", "date")


def with_date(log: DataFrame) -> DataFrame:
    """Adds ``date`` (day of the store time in spark.sql.session.timeZone), the partition column."""
    return log.withColumn("date", F.to_date("store_timestamp"))


@click.command("export")
@master_option
@source_options
@click.option("--output", required=True, type=click.Path(file_okay=False), help="Parquet dataset directory.")
@click.option("--mode", type=click.Choice(["error", "overwrite", "append"]), default="error", show_default=True)
@click.option("--broker-address", help="host:port of the store's broker, to fill msg_id.")
def command(master: str | None, output: str, mode: str, broker_address: str | None, **source: str | None) -> None:
    """Export messages to Parquet partitioned by topic and date."""
    spark = spark_session("gms-export", master)
    log = read_log(spark, brokerAddress=broker_address, **source)
    with_date(log).write.mode(mode).partitionBy(*PARTITION_COLUMNS).parquet(output)
    written = spark.read.parquet(output).count()
    click.echo(f"{output}: {written} messages")


def main(argv: Sequence[str] | None = None) -> None:
    command.main(args=list(argv) if argv is not None else None, prog_name="export")


if __name__ == "__main__":
    main()
