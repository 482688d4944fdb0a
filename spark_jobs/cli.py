"""``gms spark …``: the Spark jobs as one click group (mounted by the gms CLI).

    from gms.spark_jobs.cli import spark
    main_group.add_command(spark)
"""

from __future__ import annotations

import click

from gms.spark_jobs.jobs import export, lag, replay, topic_stats


@click.group("spark")
def spark() -> None:
    """Spark jobs over the log: topic-stats, lag, export, replay (local[*] unless --master)."""


for _job in (topic_stats, lag, export, replay):
    spark.add_command(_job.command)
