"""Options shared by gms commands, each defined once and stacked as decorators (pip-tools'
``scripts/options.py`` style), so every command spells and documents them the same way."""

from __future__ import annotations

from typing import Any

import click

from gms.client.routing import split_addresses
from gms.cluster.model import CLEANUP_POLICIES, SEGMENT_ROLL_MESSAGES_MAX, TOPIC_MESSAGE_TYPES
from gms.times import parse_time_ms

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

class TimeParam(click.ParamType):
    """A time as :func:`gms.times.parse_time_ms` reads it: epoch ms or ISO 8601 (no zone = UTC).
    Every time the CLI takes is one of these (docs/cli.md, Times)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_time_ms(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of tables (for scripts).",
)

topic_argument = click.argument("topic")

queues_option = click.option(
    "--queues", "-q", type=click.IntRange(1, 1024), help="Number of queues of the topic.",
)

_TOPIC_SETTING_OPTIONS = (
    click.option("--retention-ms", type=click.IntRange(min=1),
                 help="Messages older than this (milliseconds since stored) are no longer served and their"
                      " space is reclaimed once no other topic needs it (topic setting; default: the"
                      " broker's --retention-hours)."),
    click.option("--retention-hours", type=click.FloatRange(min=0, min_open=True),
                 help="--retention-ms in hours."),
    click.option("--message-size-max", "message_size_bytes_max", type=click.IntRange(min=1),
                 help="Largest message in bytes the topic accepts, counted as stored: body plus about"
                      " 80 bytes of headers, topic, tag, keys and properties (topic setting; default 4 MiB)."),
    click.option("--min-insync-replicas", type=click.IntRange(1, 16),
                 help="In-sync replicas an acks=-1 send needs (topic setting; default 1 for one replica,"
                      " else 2)."),
    click.option("--unclean-leader-election/--no-unclean-leader-election", default=None,
                 help="Let an out-of-sync replica lead when no in-sync one is alive: available, but"
                      " acknowledged messages may be lost (topic setting; default off)."),
    click.option("--message-type", type=click.Choice(TOPIC_MESSAGE_TYPES),
                 help="The messages the topic accepts from RocketMQ 5 clients; mixed: all four types"
                      " (topic setting; default mixed)."),
    click.option("--cleanup", "cleanup_policy", type=click.Choice(CLEANUP_POLICIES),
                 help="delete: old messages go by retention; compact: keep the latest message per key"
                      " (and its tombstone for --tombstone-retention-ms); compact,delete: both (topic"
                      " setting; default delete; docs/storage-format.md \"Compacted topics\")."),
    click.option("--min-compaction-lag-ms", type=click.IntRange(min=0),
                 help="A message stays uncompacted at least this long after it was stored (default 0)."),
    click.option("--dirty-ratio", type=click.FloatRange(0, 1),
                 help="The cleaner compacts a queue once this fraction of its bytes is not yet"
                      " compacted (default 0.5)."),
    click.option("--tombstone-retention-ms", type=click.IntRange(min=0),
                 help="How long a tombstone (property __TOMBSTONE) stays readable once compacted,"
                      " counted from when it was stored (default 1 day)."),
    click.option("--segment-roll-messages", type=click.IntRange(1, SEGMENT_ROLL_MESSAGES_MAX),
                 help="Compaction points are multiples of this many queue offsets (default 1000)."),
)


def topic_setting_options(command: Any) -> Any:
    """The topic setting options of ``topic create`` and ``topic update``, stacked."""
    for option in reversed(_TOPIC_SETTING_OPTIONS):
        command = option(command)
    return command


def topic_settings(*, retention_ms: int | None, retention_hours: float | None,
                   message_size_bytes_max: int | None, min_insync_replicas: int | None,
                   unclean_leader_election: bool | None, message_type: str | None,
                   **compaction: Any) -> dict[str, Any]:
    """The nameserver's ``settings`` map from the setting options: only those given, so an update
    changes exactly the settings named on the command line."""
    if retention_ms is not None and retention_hours is not None:
        raise click.UsageError("give --retention-ms or --retention-hours, not both")
    if retention_hours is not None:
        retention_ms = max(1, round(retention_hours * 3_600_000))
    given = {"retention_ms": retention_ms, "message_size_bytes_max": message_size_bytes_max,
             "min_insync_replicas": min_insync_replicas, "unclean_leader_election": unclean_leader_election,
             "message_type": message_type, **compaction}
    return {name: value for name, value in given.items() if value is not None}
