"""``gms-nameserver``: run one nameserver in the foreground.

With ``--etcd`` it uses that etcd cluster; without, it runs an embedded etcd child under
``--data-dir`` and stops it on exit. SIGTERM/SIGINT stop cleanly; a second one forces.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

import click

from gms import __version__
from gms.cluster.errors import EmbeddedEtcdError, EtcdAuthFailed, EtcdUnavailable
from gms.cluster.etcd_client import parse_endpoints
from gms.cluster.metadata import DEFAULT_PREFIX
from gms.envvars import options_from_env
from gms.logging_setup import configure_logging_from, log_options
from gms.nameserver.embedded_etcd import EmbeddedEtcd, EmbeddedEtcdAuth, etcd_hosts
from gms.nameserver.server import DEFAULT_PORT, NameServer, split_listen
from gms.net import run
from gms.net.serve import serve_until_signalled, write_port_file
from gms.private_files import kept_secret
from gms.security.config import SecurityConfig
from gms.security.options import pop_security_values, security_options
from gms.security.tls import TlsFiles

log = logging.getLogger("gms.nameserver")

DEFAULT_DATA_DIR = Path("gms-data/nameserver")


@options_from_env("GMS_NAMESERVER")
@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="gms-nameserver")
@click.option("--listen", default=f"0.0.0.0:{DEFAULT_PORT}", help="host:port to serve on (port 0 picks a free one).")
@click.option("--etcd", "etcd_endpoints", help="etcd endpoints host:port[,host:port]; omit to run an embedded etcd.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DATA_DIR,
              help="Where the embedded etcd keeps its data (unused with --etcd).")
@click.option("--advertised-address", default="",
              help="host:port other machines use to reach this nameserver (default: derived from --listen).")
@click.option("--port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound port here once serving (for scripts and tests).")
@click.option("--metrics-listen", help="host:port of /metrics (Prometheus), /healthz and /readyz (default: none;"
                                     " port 0 picks a free one).")
@click.option("--metrics-port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound --metrics-listen port here once serving.")
@log_options
@security_options
def main(listen: str, etcd_endpoints: str | None, data_dir: Path, advertised_address: str,
         port_file: Path | None, metrics_listen: str | None, metrics_port_file: Path | None, **flags: Any) -> None:
    """Run a gms nameserver: topic routes and cluster metadata, backed by etcd."""
    configure_logging_from(flags)
    if metrics_port_file is not None and not metrics_listen:
        raise click.UsageError("--metrics-port-file needs --metrics-listen")
    try:
        security = SecurityConfig(**pop_security_values(flags))
        etcd_host, etcd_advertise_host = etcd_hosts(split_listen(listen)[0], advertised_address)
        if metrics_listen:
            split_listen(metrics_listen)
        if etcd_endpoints:
            parse_endpoints(etcd_endpoints)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    embedded: EmbeddedEtcd | None = None
    if not etcd_endpoints:
        try:
            etcd_tls, etcd_auth = embedded_etcd_security(security, data_dir)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
        if etcd_tls is not None:  # this nameserver reaches its own etcd as brokers do: trusting tls_ca
            security = dataclasses.replace(security, etcd_ca=security.etcd_ca or security.tls_ca)
        # Started from the main thread: the child's death signal follows this thread.
        # etcd serves where the nameserver does, so brokers on other hosts can reach it.
        embedded = EmbeddedEtcd(data_dir / "etcd", host=etcd_host, advertise_host=etcd_advertise_host,
                                tls=etcd_tls, auth=etcd_auth)
        try:
            embedded.start()
        except EmbeddedEtcdError as err:
            log.error("cannot start the embedded etcd: %s", err)
            sys.exit(1)
        log.info("embedded etcd on %s (data in %s)", embedded.endpoint, embedded.data_dir)
        etcd_endpoints = embedded.endpoint
    server = NameServer(etcd_endpoints, listen, advertised=advertised_address, security=security,
                        metrics_listen=metrics_listen or "")

    def started() -> str:
        """The start line, once the metrics port is published too."""
        if metrics_port_file is not None and server.monitoring is not None:
            write_port_file(metrics_port_file, server.monitoring.port)
        metrics = f"; metrics on {server.metrics_address}" if server.monitoring else ""
        return f"nameserver serving on {server.address} (etcd {server.etcd_endpoints}){metrics}"

    try:
        code = run(serve_until_signalled(server, "nameserver", log, port_file=port_file, start_error=_start_error,
                                         started=started))
    finally:
        if embedded is not None:
            embedded.stop()
            log.info("embedded etcd stopped")
    sys.exit(code)


def embedded_etcd_security(security: SecurityConfig, data_dir: Path) -> tuple[TlsFiles | None,
                                                                             EmbeddedEtcdAuth | None]:
    """A secured nameserver secures the etcd it embeds the same way: TLS with its own certificate,
    authentication as its etcd user (brokers are given the same ``--etcd-user`` / ``--etcd-password``
    / ``--etcd-ca``), etcd's root password generated into the data dir."""
    if not security.enabled:
        return None, None
    if not security.etcd_user:
        raise ValueError("a secured nameserver secures its embedded etcd too: give --etcd-user and --etcd-password"
                         " (brokers reach etcd with the same), or point --etcd at an etcd secured by other means")
    tls = None
    if security.tls:
        if not security.tls_ca:
            raise ValueError("the embedded etcd serves TLS with --tls-cert; give --tls-ca, which clients check it with")
        tls = TlsFiles(security.tls_ca, security.tls_cert, security.tls_key)
    root_password = kept_secret(data_dir / "secrets" / "etcd-root.password")
    return tls, EmbeddedEtcdAuth(root_password, security.etcd_user, security.etcd_password, DEFAULT_PREFIX)


def _start_error(err: BaseException) -> str | None:
    if isinstance(err, EtcdAuthFailed):
        return f"etcd refused this nameserver ({err}): check --etcd-user, --etcd-password and --etcd-ca"
    if isinstance(err, EtcdUnavailable):
        return (f"cannot reach etcd ({err}): start etcd there, fix --etcd, or omit --etcd"
                " to run an embedded etcd")
    if isinstance(err, OSError):
        return f"cannot listen: {err}; pick another port with --listen or --metrics-listen HOST:PORT"
    return None
