"""Options shared by gms commands, each defined once and stacked as decorators (pip-tools'
``scripts/options.py`` style), so every command spells and documents them the same way."""

from __future__ import annotations

from typing import Any

import click

from gms.client.routing import split_addresses

DEFAULT_NAMESERVER = "127.0.0.1:9876"
NAMESERVER_ENV = "GMS_NAMESERVER"


def _check_nameserver(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return ",".join(split_addresses(value))
    except ValueError as err:
        raise click.BadParameter(f"{err} (expected host:port[,host:port])") from err


nameserver_option = click.option(
    "--nameserver", "-n", default=DEFAULT_NAMESERVER, envvar=NAMESERVER_ENV, show_default=True,
    show_envvar=True, callback=_check_nameserver,
    help="Nameserver address(es) host:port[,host:port]; the first that answers is used.",
)

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of tables (for scripts).",
)

topic_argument = click.argument("topic")

queues_option = click.option(
    "--queues", "-q", type=click.IntRange(1, 1024), help="Number of queues of the topic.",
)

retention_option = click.option(
    "--retention-hours", type=click.FloatRange(min=0, min_open=True),
    help="Delete messages older than this (topic setting).",
)

message_size_option = click.option(
    "--message-size-max", "message_size_bytes_max", type=click.IntRange(min=1),
    help="Largest message body in bytes the topic accepts (topic setting).",
)


def topic_settings(retention_hours: float | None, message_size_bytes_max: int | None) -> dict[str, Any]:
    """The nameserver's ``settings`` map from the two setting options (only those given)."""
    settings: dict[str, Any] = {}
    if retention_hours is not None:
        settings["retention_ms"] = max(1, round(retention_hours * 3_600_000))
    if message_size_bytes_max is not None:
        settings["message_size_bytes_max"] = message_size_bytes_max
    return settings
