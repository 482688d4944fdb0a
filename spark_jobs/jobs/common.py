"""What every job shares: the Spark session, the source options as click options, the reader."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click
from pyspark.sql import DataFrame, SparkSession

from gms.spark_jobs.datasource import SOURCE_NAME, register

MASTER_DEFAULT = "local[*]"
SPARK_SUBMIT_GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"  # set when spark-submit runs the Python driver
LOCAL_IP_ENV = "SPARK_LOCAL_IP"  # the user's own choice of the driver's address


def spark_session(app_name: str, master: str | None) -> SparkSession:
    """A session with the gms format registered. ``--master`` wins; without it, a job started by
    spark-submit (which hands Python a gateway) keeps the submitted master, else local[*]."""
    if master is None and SPARK_SUBMIT_GATEWAY_ENV not in os.environ:
        master = MASTER_DEFAULT
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    if master and master.startswith("local") and LOCAL_IP_ENV not in os.environ:
        # Spark otherwise binds the driver to the host's first interface: a local job stays on loopback.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    register(spark)
    return spark


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _stack(*decorators: Decorator) -> Decorator:
    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func
    return apply


master_option = click.option("--master", default=None,
                             help=f"Spark master URL (default {MASTER_DEFAULT}).")

source_options = _stack(
    click.option("--store", "store", type=click.Path(exists=True, file_okay=False),
                 help="A broker's --store-dir (or its store/ folder), read with no broker needed."),
    click.option("--brokers", help="Read a live cluster through these brokers (host:port,...)."),
    click.option("--nameserver", help="Read a live cluster routed by these nameservers (host:port,...)."),
    click.option("--topics", help="Comma-separated topics (default: all)."),
    click.option("--tags", help="Tag expression, e.g. 'paid || shipped'."),
    click.option("--start-time", help="Epoch ms or ISO-8601 (UTC); inclusive."),
    click.option("--end-time", help="Epoch ms or ISO-8601 (UTC); exclusive."),
)


def read_log(spark: SparkSession, *, store: str | None, brokers: str | None, nameserver: str | None,
             topics: str | None, tags: str | None, start_time: str | None, end_time: str | None,
             columns: str | None = None, **extra: str | None) -> DataFrame:
    """The gms DataFrame the source options select."""
    if (store is None) == (brokers is None and nameserver is None):
        raise click.UsageError("give --store DIR, or --brokers / --nameserver for a live cluster")
    options = {"topics": topics, "tags": tags, "startTime": start_time, "endTime": end_time,
               "brokers": brokers, "nameserver": nameserver, "columns": columns, **extra}
    reader = spark.read.format(SOURCE_NAME)
    for name, value in options.items():
        if value is not None:
            reader = reader.option(name, value)
    return reader.load(store) if store is not None else reader.load()


def offsets_json(offsets: dict[str, dict[int, int]]) -> str:
    return json.dumps({topic: {str(q): o for q, o in queues.items()} for topic, queues in offsets.items()})
