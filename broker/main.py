"""``gms-broker``: run one broker in the foreground."""

from __future__ import annotations

import gc
import logging
import resource
import sys
from pathlib import Path

import click

from gms import __version__
from gms.broker.config import DEFAULT_PORT, load_config
from gms.broker.rocketmq import ROCKETMQ_EXTRA, stubs_installed
from gms.envvars import options_from_env
from gms.errors import GmsError
from gms.logging_setup import configure_logging_from, log_options
from gms.security.options import pop_security_values, security_options

log = logging.getLogger("gms.broker")

NR_OPEN_PATH = Path("/proc/sys/fs/nr_open")  # the kernel's ceiling for an unlimited hard limit


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return it: each mapped file holds a
    descriptor, and a default soft limit of 1,024 is met by a broker with a few hundred queues
    (the store still refuses new files with a clear error short of the limit, see
    ``gms.broker.mapped_file.check_fd_headroom``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = int(NR_OPEN_PATH.read_text()) if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


# The garbage collector's thresholds (gc.set_threshold): young collections every GC_YOUNG_OBJECTS
# allocations instead of 700, older ones as rarely relative to them as Python's defaults.
GC_YOUNG_OBJECTS = 50_000
GC_OLDER_RATIOS = (20, 10)


def tune_gc() -> None:
    """Collect garbage less often than Python's defaults. A broker keeps a few dozen objects per
    queue for its life (index files, maps, replica and producer state): with thousands of queues
    a full collection walks hundreds of thousands of objects (~90 ms on the 2-core test machine),
    and a request naming a thousand queues allocates enough objects that live a while (a FETCH's
    rows and results, a long poll's waiters) to set one off every few hundred milliseconds: a
    third of the CPU of a broker serving a group of 1,000 topics went to them. Reference cycles
    are still collected, a little later."""
    gc.set_threshold(GC_YOUNG_OBJECTS, *GC_OLDER_RATIOS)


@options_from_env("GMS_BROKER")
@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="gms-broker")
@click.option("--listen", help=f"host:port to serve on (default 0.0.0.0:{DEFAULT_PORT}; port 0 picks a free one).")
@click.option("--metrics-listen", help="host:port of /metrics (Prometheus), /healthz and /readyz (default: none;"
                                     " port 0 picks a free one).")
@click.option("--rocketmq-listen", help="host:port of the RocketMQ 5 gRPC API for official RocketMQ clients (default:"
                                      " none; port 0 picks a free one; needs the `rocketmq` extra).")
@click.option("--kafka-listen", help="host:port of the Kafka API for Kafka clients (default: none; port 0 picks a"
                                   " free one; docs/kafka-compat.md).")
@click.option("--kafka-advertised", help="host:port Kafka clients are told to use (default: the advertised address's"
                                       " host with the --kafka-listen port).")
@click.option("--store-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the commitlog and queues live (default ./gms-data/broker).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="TOML file with [broker], [store] and [security] tables; flags and GMS_BROKER_* variables"
                   " override it.")
@click.option("--name", "broker_name", help="Broker name, its identity in the cluster (default: the one kept in the"
                                         " store, else the advertised address of its first start).")
@click.option("--advertised-address", help="host:port clients should use to reach this broker.")
@click.option("--nameserver", help="Nameserver address(es) host:port[,host:port] to register with.")
@click.option("--flush", "flush_mode", type=click.Choice(["async", "sync"]),
              help="async: flush in the background; sync: acknowledge only after fsync (group commit).")
@click.option("--commitlog-file-size", "commitlog_file_size_bytes", type=int,
              help="Size of each commitlog file in bytes, for a new store (default 1 GiB; an existing store"
                   " keeps its own).")
@click.option("--cq-file-entries", "cq_entries_per_file", type=int,
              help="Entries per consumeQueue file for a new store (default 300000; 20 bytes each; an existing"
                   " store keeps its own).")
@click.option("--retention-hours", type=float,
              help="Retention of topics without their own retention_ms (default 72); commitlog files go once no topic "
                   "needs them.")
@click.option("--busy-poll-us", type=click.IntRange(min=0),
              help="Keep polling the network this many µs after each request before sleeping: lower latency"
                   " for up to that much CPU per gap between requests (default 50 with --flush async, 0 with sync;"
                   " 0: off).")
@click.option("--auto-create-topics/--no-auto-create-topics", default=None, help="Create unknown topics on first send.")
@click.option("--port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound port here once serving (for scripts and tests).")
@click.option("--metrics-port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound --metrics-listen port here once serving.")
@click.option("--rocketmq-port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound --rocketmq-listen port here once serving.")
@click.option("--kafka-port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound --kafka-listen port here once serving.")
@log_options
@security_options
def main(config_path, port_file, metrics_port_file, rocketmq_port_file, kafka_port_file, flush_mode,
         commitlog_file_size_bytes, cq_entries_per_file, retention_hours, **broker_overrides) -> None:
    """Run a gms broker: the commitlog store and the send/pull/group server."""
    configure_logging_from(broker_overrides)
    security = pop_security_values(broker_overrides)
    try:
        config = load_config(
            config_path,
            broker_overrides,
            {"flush_mode": flush_mode, "commitlog_file_size_bytes": commitlog_file_size_bytes,
             "cq_entries_per_file": cq_entries_per_file, "retention_hours": retention_hours},
            security,
        )
    except (ValueError, TypeError, OSError) as err:
        raise click.UsageError(str(err)) from err
    if metrics_port_file is not None and not config.metrics_listen:
        raise click.UsageError("--metrics-port-file needs --metrics-listen (or metrics_listen in [broker])")
    if rocketmq_port_file is not None and not config.rocketmq_listen:
        raise click.UsageError("--rocketmq-port-file needs --rocketmq-listen (or rocketmq_listen in [broker])")
    if kafka_port_file is not None and not config.kafka_listen:
        raise click.UsageError("--kafka-port-file needs --kafka-listen (or kafka_listen in [broker])")
    if config.rocketmq_listen and not stubs_installed():
        raise click.UsageError(f"--rocketmq-listen needs {ROCKETMQ_EXTRA}")
    log.info("file descriptor limit (soft RLIMIT_NOFILE): %d", raise_fd_limit())
    tune_gc()
    from gms.broker.server import BrokerServer
    from gms.net import run
    from gms.net.serve import serve_until_signalled, write_port_file

    try:
        server = BrokerServer(config)  # opens the store: recovery runs here
    except (OSError, GmsError) as err:
        log.error("cannot start: %s", err)
        sys.exit(1)

    def started() -> str:
        """The start line, once the metrics port is published too."""
        if metrics_port_file is not None and server.monitoring is not None:
            write_port_file(metrics_port_file, server.monitoring.port)
        rocketmq = ""
        if server.rocketmq is not None:
            if rocketmq_port_file is not None:
                write_port_file(rocketmq_port_file, server.rocketmq.port)
            rocketmq = f"; RocketMQ API on {config.rocketmq_host_port[0]}:{server.rocketmq.port}"
        kafka = ""
        if server.kafka is not None:
            if kafka_port_file is not None:
                write_port_file(kafka_port_file, server.kafka.port)
            kafka = f"; Kafka API on {config.kafka_host_port[0]}:{server.kafka.port} ({server.kafka.endpoint})"
        metrics = f"; metrics on {config.metrics_host_port[0]}:{server.monitoring.port}" if server.monitoring else ""
        return (f"broker {server.name} serving on {server.address} (store {config.store_dir})"
                f"{metrics}{rocketmq}{kafka}")

    sys.exit(run(serve_until_signalled(
        server, "broker", log, port_file=port_file,
        start_error=lambda err: f"cannot start: {err}" if isinstance(err, (OSError, GmsError)) else None,
        started=started,
    )))
