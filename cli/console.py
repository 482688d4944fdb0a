"""``gms console``: the web console (cluster, topics, consumer groups, message lookup) on an HTTP
port. ``python -m gms.console`` runs the same command as a server process (as ``gms standalone``
does)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from gms.address import join_address, split_address
from gms.cli.admin_context import client_security
from gms.cli.options import nameserver_option
from gms.console import ADMIN_HOW
from gms.net import run
from gms.net.serve import serve_until_signalled

log = logging.getLogger("gms.console")

DEFAULT_LISTEN = "127.0.0.1:8082"  # RocketMQ Dashboard's port


def _check_listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        return split_address(value, "listen address", port_zero_ok=True)
    except ValueError as err:
        raise click.BadParameter(f"{err} (expected host:port, e.g. 127.0.0.1:8082; port 0 picks a free one)") from err


@click.command()
@nameserver_option
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, callback=_check_listen,
              help="host:port to serve the console on (port 0 picks a free one). Anyone who reaches it sees the"
                   " cluster with the console's credentials: keep it on loopback or behind an authenticating proxy.")
@click.option("--admin", is_flag=True,
              help="Turn on admin actions (create topics, reset consumer group offsets); read-only without.")
@click.option("--admin-how", default=ADMIN_HOW, hidden=True,
              help="The command line a read-only console names for admin actions (`gms standalone` gives its own).")
@click.option("--allow-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer requests addressed to this host name: the name users or a reverse proxy reach the"
                   " console by (repeatable). IP addresses and localhost always are; other names are refused, a"
                   " guard against DNS rebinding.")
@click.option("--port-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the bound port to this file once serving (for supervisors and scripts).")
@click.option("--sample-interval", "sample_interval_s", type=click.FloatRange(0.5, 60), default=5.0,
              show_default=True, help="Seconds between the samples the rate and lag charts draw.")
def console(nameserver: str, listen: tuple[str, int], admin: bool, admin_how: str, allowed_hosts: tuple[str, ...],
            port_file: Path | None, sample_interval_s: float) -> None:
    """Serve the web console: cluster health, topics with live rates, consumer groups with lag,
    message lookup by id. Read-only unless --admin.

    It reads everything through the nameserver with the credentials of `gms --user/--password
    --tls-*` (or the GMS_* variables), so on a secured cluster that user's permissions apply to
    what it shows and does."""
    # Imported here: aiohttp would add a tenth of a second to every other gms command.
    from gms.console.server import ConsoleServer, ConsoleSettings

    host, port = listen
    settings = ConsoleSettings(nameserver, host, port, admin=admin, admin_how=admin_how, allowed_hosts=allowed_hosts,
                               sample_interval_s=sample_interval_s)
    server = ConsoleServer(settings, client_security())

    def started() -> str:
        url = f"http://{join_address(host, server.port)}/"
        click.echo(f"console on {url}")
        return f"console serving on {url} for nameserver {nameserver} ({'admin actions on' if admin else 'read-only'})"

    def start_error(err: BaseException) -> str | None:
        if isinstance(err, OSError):
            return f"cannot listen on {join_address(host, port)}: {err}; pick another address with --listen"
        return None

    sys.exit(run(serve_until_signalled(server, "console", log, port_file=port_file, start_error=start_error,
                                       started=started)))
