"""replay: re-publish a filtered slice of the log into a topic through the gms sink.

Each Spark task sends its rows through its own idempotent producer (``df.write.format("gms")``),
so the copy runs in parallel and never collects the slice on the driver. Tags, keys, properties
and bodies are kept; the target topic must exist.

    python -m gms.spark_jobs.jobs.replay --store /var/lib/gms/broker0 --topics orders \\
        --tags failed --to-topic orders-retry --to-brokers 10.0.0.5:10911
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from pyspark.sql import DataFrame

from gms.spark_jobs.datasource import SOURCE_NAME, rows_written
from gms.spark_jobs.jobs.common import master_option, read_log, source_options, spark_session

REPLAY_COLUMNS = "tag,keys,properties,body"


def replay(log: DataFrame, to_topic: str, *, brokers: str | None, nameserver: str | None) -> int:
    """Send every row of ``log`` (its ``REPLAY_COLUMNS``) to ``to_topic``; returns how many were
    acknowledged."""
    before = rows_written(log.sparkSession) or 0
    cluster = {"brokers": brokers} if brokers is not None else {"nameserver": nameserver}
    (log.select(*REPLAY_COLUMNS.split(",")).write.format(SOURCE_NAME).mode("append")
     .option("topic", to_topic).options(**cluster).save())
    return (rows_written(log.sparkSession) or 0) - before


@click.command("replay")
@master_option
@source_options
@click.option("--to-topic", required=True, help="Topic to publish into (must exist).")
@click.option("--to-brokers", help="Brokers to publish to (host:port,...).")
@click.option("--to-nameserver", help="Nameservers of the cluster to publish to.")
def command(master: str | None, to_topic: str, to_brokers: str | None, to_nameserver: str | None,
            **source: str | None) -> None:
    """Re-publish a filtered slice of a topic into another topic."""
    if (to_brokers is None) == (to_nameserver is None):
        raise click.UsageError("give --to-brokers or --to-nameserver")
    spark = spark_session("gms-replay", master)
    log = read_log(spark, columns=REPLAY_COLUMNS, **source)
    sent = replay(log, to_topic, brokers=to_brokers, nameserver=to_nameserver)
    click.echo(f"replayed {sent} messages into {to_topic}")


def main(argv: Sequence[str] | None = None) -> None:
    command.main(args=list(argv) if argv is not None else None, prog_name="replay")


if __name__ == "__main__":
    main()
