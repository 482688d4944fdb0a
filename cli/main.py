"""Entry point of ``gms``: the root command group and the one place expected failures become
short messages with exit code 1 (usage errors are click's, exit code 2; no tracebacks)."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from gms import __version__
from gms.cli import standalone_ports as ports
from gms.cli.cluster import cluster, msg
from gms.cli.console import console
from gms.cli.dlq import dlq
from gms.cli.group import group
from gms.cli.interrupts import INTERRUPTED_EXIT_CODE
from gms.cli.messages import produce, tail
from gms.cli.output import error_text
from gms.cli.security import acl, user
from gms.cli.topic import topic
from gms.cli.trace import trace_message
from gms.cli.transactions import tx
from gms.envvars import options_from_env
from gms.errors import GmsError
from gms.log_throttle import RepeatFilter
from gms.security.client import (
    ENV_PASSWORD,
    ENV_TLS,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_USER,
    ClientSecurity,
)
from gms.security.tls import TlsFiles

# `gms spark` comes from the Spark jobs package when it is there; imported only when used,
# so the rest of the CLI never needs pyspark.
SPARK_COMMAND = "spark"
SPARK_MODULE = "gms.spark_jobs.cli"
SPARK_GROUP_NAMES = ("cli", "spark", "main")


class GmsGroup(click.Group):
    """Turns the errors a user can fix into one line that says what to do."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GmsError as err:
            raise click.ClickException(error_text(err)) from err
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(INTERRUPTED_EXIT_CODE)

    # --- `gms spark`, mounted lazily ---------------------------------------------------------------

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        if _spark_available():
            names = sorted([*names, SPARK_COMMAND])
        return names

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == SPARK_COMMAND and _spark_available():
            module = importlib.import_module(SPARK_MODULE)
            for attr in SPARK_GROUP_NAMES:
                command = getattr(module, attr, None)
                if isinstance(command, click.Command):
                    return command
        return super().get_command(ctx, name)


def _spark_available() -> bool:
    try:
        return importlib.util.find_spec(SPARK_MODULE) is not None
    except ImportError:
        return False


_PEM = click.Path(dir_okay=False, exists=True)


@click.group(cls=GmsGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gms")
@click.option("--tls/--no-tls", default=None, envvar=ENV_TLS, show_envvar=True,
              help="Connect with TLS (implied by --tls-ca / --tls-cert); without --tls-ca, the system's trusted CAs.")
@click.option("--tls-ca", type=_PEM, envvar=ENV_TLS_CA, show_envvar=True,
              help="PEM CA bundle the servers' certificates are checked against.")
@click.option("--tls-cert", type=_PEM, envvar=ENV_TLS_CERT, show_envvar=True,
              help="PEM client certificate, for clusters that demand one (mutual TLS).")
@click.option("--tls-key", type=_PEM, envvar=ENV_TLS_KEY, show_envvar=True, help="PEM key of --tls-cert.")
@click.option("--user", "-u", envvar=ENV_USER, show_envvar=True, help="User to authenticate as (SCRAM-SHA-256).")
@click.option("--password", envvar=ENV_PASSWORD, show_envvar=True,
              help="Password of --user (prefer the variable: flags show in the process list).")
@click.pass_context
def cli(ctx: click.Context, tls: bool | None, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
        user: str | None, password: str | None) -> None:
    """gms: topics, messages, consumer groups and the cluster, from the command line.

    Start a one-machine cluster with `gms standalone`, then in another terminal:
    `gms topic create orders`, `echo hello | gms produce orders`, `gms tail orders`.
    """
    files = TlsFiles(tls_ca or "", tls_cert or "", tls_key or "")
    use_tls = bool(tls_ca or tls_cert) if tls is None else tls
    try:
        ctx.obj = ClientSecurity(files if use_tls else None, user or "", password or "")
    except ValueError as err:
        raise click.UsageError(str(err)) from err


@options_from_env("GMS_STANDALONE")
@cli.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("gms-data"),
              show_default=True, help="Where etcd, the nameserver and the broker keep their data and logs.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--nameserver-port", type=click.IntRange(0, 65535), default=ports.NAMESERVER_PORT, show_default=True,
              help="Nameserver port (0 picks a free one).")
@click.option("--broker-port", type=click.IntRange(0, 65535), default=ports.BROKER_PORT, show_default=True,
              help="Broker port (0 picks a free one).")
@click.option("--etcd-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Embedded etcd client port (0: the one kept in the data dir, else a free one).")
@click.option("--nameserver-metrics-port", type=click.IntRange(0, 65535), default=ports.NAMESERVER_METRICS_PORT,
              show_default=True, help="The nameserver's /metrics, /healthz and /readyz (0 picks a free one).")
@click.option("--broker-metrics-port", type=click.IntRange(0, 65535), default=ports.BROKER_METRICS_PORT,
              show_default=True, help="The broker's /metrics, /healthz and /readyz (0 picks a free one).")
@click.option("--console-port", type=click.IntRange(0, 65535), default=ports.CONSOLE_PORT, show_default=True,
              help="The web console (0 picks a free one).")
@click.option("--console/--no-console", "with_console", default=True, show_default=True,
              help="Serve the web console.")
@click.option("--console-admin", is_flag=True,
              help="Allow the console's admin actions (create topics, reset offsets); read-only otherwise.")
@click.option("--rocketmq-port", type=click.IntRange(0, 65535), default=ports.ROCKETMQ_PORT, show_default=True,
              help="The RocketMQ 5 gRPC API for official RocketMQ clients (0 picks a free one; needs the"
                   " `rocketmq` extra).")
@click.option("--rocketmq/--no-rocketmq", "with_rocketmq", default=True, show_default=True,
              help="Serve the RocketMQ 5 gRPC API (when the `rocketmq` extra is installed).")
@click.option("--kafka-port", type=click.IntRange(0, 65535), default=ports.KAFKA_PORT, show_default=True,
              help="The Kafka API for Kafka clients (0 picks a free one).")
@click.option("--kafka/--no-kafka", "with_kafka", default=True, show_default=True, help="Serve the Kafka API.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="The servers' log lines (in the data dir's logs/) as text, or one JSON object per line.")
@click.option("--commitlog-file-size", type=click.IntRange(4096), default=None,
              help="Bytes per commitlog file for a new store (default 128 MiB; disk is taken as they fill);"
                   " a store keeps its size.")
@click.option("--secure", is_flag=True,
              help="TLS with a development CA, authentication and ACLs, an 'admin' super user (files in the data dir;"
                   " prints how to point clients at it).")
def standalone(data_dir: Path, host: str, nameserver_port: int, broker_port: int, etcd_port: int,
               nameserver_metrics_port: int, broker_metrics_port: int, console_port: int, with_console: bool,
               console_admin: bool, rocketmq_port: int, with_rocketmq: bool, kafka_port: int, with_kafka: bool,
               log_level: str, log_format: str,
               commitlog_file_size: int | None, secure: bool) -> None:
    """Run embedded etcd + a nameserver + a broker + the web console in the foreground (Ctrl-C
    stops all). Both servers serve Prometheus /metrics, /healthz and /readyz."""
    from gms.cli.standalone import StandaloneOptions, run_standalone

    given = click.get_current_context().get_parameter_source
    rocketmq_asked = any(given(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
                         for name in ("rocketmq_port", "with_rocketmq"))
    options = StandaloneOptions(
        data_dir, nameserver_port, broker_port, host=host, etcd_port=etcd_port,
        nameserver_metrics_port=nameserver_metrics_port, broker_metrics_port=broker_metrics_port,
        console_port=console_port if with_console else None, console_admin=console_admin,
        rocketmq_port=rocketmq_port if with_rocketmq else None, rocketmq_asked=rocketmq_asked,
        kafka_port=kafka_port if with_kafka else None,
        log_level=log_level, log_format=log_format, commitlog_file_size_bytes=commitlog_file_size, secure=secure)
    code = run_standalone(options, echo=click.echo)
    sys.exit(code)


cli.add_command(topic)
cli.add_command(produce)
cli.add_command(tail)
cli.add_command(group)
cli.add_command(cluster)
msg.add_command(trace_message)
cli.add_command(msg)
cli.add_command(user)
cli.add_command(dlq)
cli.add_command(acl)
cli.add_command(console)
cli.add_command(tx)


def _log_to_stderr() -> None:
    """The SDK's warnings (a broker gone for a moment, a failed heartbeat) go to stderr, so the
    messages `gms tail` prints on stdout stay clean for pipes, and each kind of warning at most
    once a minute (a retry loop must not flood the terminal)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.addFilter(RepeatFilter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def main() -> None:
    _log_to_stderr()
    cli(prog_name="gms")
