"""``gms group``: consumer groups — list them, describe members, assignment and lag, move
their committed offsets (``reset-offsets``, as Kafka's ``kafka-consumer-groups --reset-offsets``)
and delete them."""

from __future__ import annotations

import re
from typing import Any

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import TimeParam, json_option, nameserver_option
from gms.cli.output import print_json, show, table, time_text
from gms.client.display import group_lag
from gms.client.offset_reset import QueueReset, ResetSpec
from gms.cluster.model import GroupSettings
from gms.errors import GroupNotEmptyError, GroupNotFoundError, QueueNotFoundError, TopicNotFoundError


@click.group()
def group() -> None:
    """List consumer groups, show their members, assignment and lag, reset their offsets,
    delete them, create them and set their retry and FIFO settings."""


@group.command(name="list")
@nameserver_option
@json_option
def list_groups(nameserver: str, as_json: bool) -> None:
    """List the consumer groups the live brokers know."""
    with open_admin(nameserver) as admin:
        names = admin.groups()
    if as_json:
        print_json(names)
    elif not names:
        click.echo("no consumer groups")
    else:
        show(table(None, ["group"], [(n,) for n in names]))


@group.command()
@click.argument("group_name", metavar="GROUP")
@nameserver_option
@json_option
def describe(group_name: str, nameserver: str, as_json: bool) -> None:
    """Show GROUP's members, which queues each holds, committed and max offsets, and the lag."""
    with open_admin(nameserver) as admin:
        try:
            described = admin.group_describe(group_name)
        except GroupNotFoundError as err:
            raise click.ClickException(
                f"no broker knows consumer group {group_name}: no consumer of it has run yet (or the group was"
                f" deleted). Start one, e.g. `gms tail TOPIC --group {group_name}`, then describe it again") from err
        rows = group_lag(admin, described)
    total = sum(r["lag"] or 0 for r in rows)
    members: dict[str, dict[str, Any]] = {}
    for m in described["members"]:
        entry = members.setdefault(m["member"], {**m, "brokers": [], "queues": []})
        entry["brokers"].append(m["broker"])
        entry["queues"] = sorted({*map(tuple, entry["queues"]), *map(tuple, m["queues"])})
    if as_json:
        print_json({"group": group_name, "members": list(members.values()), "queues": rows, "total_lag": total})
        return
    show(
        table(f"group {group_name}: {len(members)} member(s)",
              ["member", "mode", "subscription", "queues", "last seen"],
              [(m["member"], m["mode"], ", ".join(f"{t}: {e}" for t, e in m["subscription"].items()),
                ", ".join(f"{t}/{q}" for t, q in m["queues"]), time_text(m["last_seen_ms"]))
               for m in members.values()]),
        table(f"total lag {total}", ["topic", "queue", "broker", "member", "committed", "max", "lag"],
              [(r["topic"], r["queue_id"], r["broker"], r["member"], r["committed"], r["max_offset"], r["lag"])
               for r in rows]),
    )


def _queue_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[int]:
    """``--queue 1 --queue 2,3`` → [1, 2, 3]."""
    ids = []
    for value in values:
        for part in value.split(","):
            try:
                ids.append(int(part))
            except ValueError as err:
                raise click.BadParameter(f"{part.strip()!r} is not a queue id (an integer)") from err
    return ids


def _reset_spec(to_earliest: bool, to_latest: bool, to_datetime: int | None, shift_by: int | None,
                to_offset: int | None) -> ResetSpec:
    """The one target the options name; a usage error unless exactly one is given."""
    given: dict[str, ResetSpec] = {}
    if to_earliest:
        given["--to-earliest"] = ResetSpec.earliest()
    if to_latest:
        given["--to-latest"] = ResetSpec.latest()
    if to_datetime is not None:
        given["--to-datetime"] = ResetSpec.to_datetime(to_datetime)
    if shift_by is not None:
        given["--shift-by"] = ResetSpec.shift_by(shift_by)
    if to_offset is not None:
        given["--to-offset"] = ResetSpec.to_offset(to_offset)
    if len(given) != 1:
        named = f" (got {' and '.join(given)})" if given else ""
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-datetime, --shift-by,"
                               f" --to-offset{named}")
    return next(iter(given.values()))


@group.command(name="reset-offsets")
@click.argument("group_name", metavar="GROUP")
@click.option("--topic", "-t", "topics", multiple=True, required=True,
              help="Topic whose offsets move (repeatable).")
@click.option("--queue", "queues", multiple=True, callback=_queue_ids, metavar="Q[,Q...]",
              help="Only these queues of each topic (repeatable, or comma separated). Default: every queue.")
@click.option("--to-earliest", is_flag=True, help="To the first offset still in the queue.")
@click.option("--to-latest", is_flag=True, help="To the end: only messages sent after the reset are consumed.")
@click.option("--to-datetime", type=TimeParam(),
              help="To the first message stored at or after TIME: epoch ms or ISO 8601 (no zone = UTC).")
@click.option("--shift-by", type=int, metavar="N",
              help="The committed offset plus N (negative: consume again). Queues without a committed offset"
                   " are left alone.")
@click.option("--to-offset", type=click.IntRange(min=0), metavar="N", help="To offset N.")
@click.option("--dry-run", is_flag=True, help="Only show the plan; nothing changes (the default).")
@click.option("--execute", is_flag=True, help="Store the new offsets.")
@click.option("--force", is_flag=True,
              help="Execute even while the group has live members (they may commit over the reset).")
@nameserver_option
@json_option
def reset_offsets(group_name: str, topics: tuple[str, ...], queues: list[int], to_earliest: bool, to_latest: bool,
                  to_datetime: int | None, shift_by: int | None, to_offset: int | None, dry_run: bool,
                  execute: bool, force: bool, nameserver: str, as_json: bool) -> None:
    """Move GROUP's committed offsets on the queues of --topic; new offsets are clamped to the
    queue's [min, max]. Without --execute it only prints the plan (topic, queue, committed, new).

    --execute is refused while the group has live members unless --force: they would commit
    over it. A consumer of the group started afterwards begins at the new offsets.
    """
    if dry_run and execute:
        raise click.UsageError("--dry-run and --execute exclude each other")
    spec = _reset_spec(to_earliest, to_latest, to_datetime, shift_by, to_offset)
    with open_admin(nameserver) as admin:
        try:
            rows = admin.reset_offsets(group_name, topics, spec, queues=queues or None, execute=execute, force=force)
        except TopicNotFoundError as err:
            raise click.BadParameter(str(err), param_hint="'--topic'") from err
        except QueueNotFoundError as err:
            raise click.BadParameter(str(err), param_hint="'--queue'") from err
        except GroupNotEmptyError as err:
            raise _stop_members_first(err) from err
        live = [] if execute else admin.live_members(group_name)
    _show_reset(group_name, rows, execute, live, as_json)


def _stop_members_first(err: GroupNotEmptyError) -> click.ClickException:
    return click.ClickException(f"{err}\nStop them first, or pass --force.")


def _show_reset(group_name: str, rows: list[QueueReset], executed: bool, live: list[str], as_json: bool) -> None:
    if as_json:
        print_json({"group": group_name, "executed": executed, "queues": [row._asdict() for row in rows]})
    else:
        title = f"group {group_name}: " + ("offsets reset" if executed else "new offsets (dry run)")
        show(table(title, ["topic", "queue", "min", "max", "committed", "new"],
                   [(r.topic, r.queue_id, r.min_offset, r.max_offset, r.committed, r.new_offset) for r in rows]))
        if not executed:
            click.echo("nothing changed (dry run): add --execute to store the new offsets")
        if any(r.new_offset is None for r in rows):
            click.echo("queues without a committed offset (new '-') are left alone: --shift-by has nothing to"
                       " shift there")
    if live:
        click.echo(f"warning: group {group_name} has live member(s) {', '.join(live)}: --execute is refused"
                   " without --force", err=True)


@group.command(name="delete")
@click.argument("group_name", metavar="GROUP")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True,
              help="Delete even while the group has live members (they commit again, and the group comes back).")
@nameserver_option
@json_option
def delete_group(group_name: str, yes: bool, force: bool, nameserver: str, as_json: bool) -> None:
    """Delete GROUP: its committed offsets on every broker (queue leaders and followers).

    Refused while the group has live members unless --force. A consumer of the group started
    afterwards begins where its start_from says (`gms tail --from`), as a new group.
    """
    if not yes:
        click.confirm(f"Delete consumer group {group_name} and its committed offsets?", abort=True, err=True)
    with open_admin(nameserver) as admin:
        try:
            deleted = admin.delete_group(group_name, force=force)
        except GroupNotEmptyError as err:
            raise _stop_members_first(err) from err
    if as_json:
        print_json({"deleted": group_name, "queues": {b: [list(q) for q in qs] for b, qs in deleted.items()}})
    else:
        count, brokers = sum(len(qs) for qs in deleted.values()), sum(1 for qs in deleted.values() if qs)
        click.echo(f"deleted consumer group {group_name} ({count} committed offset(s) on {brokers} broker(s))")


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DELAY = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")  # a number, milliseconds unless a unit says


def _delays(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    """``10s,30s,1m,2h`` (or plain milliseconds) as a list of milliseconds."""
    if value is None:
        return None
    delays = []
    for item in value.split(","):
        match = _DELAY.fullmatch(item.strip().lower())
        if match is None:
            raise click.BadParameter(f"{item!r} is not a delay such as 500ms, 10s, 1m or 2h", ctx, param)
        delays.append(round(float(match[1]) * _UNITS_MS[match[2] or "ms"]))
    return delays


_SETTING_OPTIONS = (
    click.option("--max-reconsume-times", type=click.IntRange(0, 1000), metavar="N",
                 help="Retries of a failed message (default 16): the nack of delivery N+1 sends it to the"
                      " group's dead letters."),
    click.option("--max-delivery-attempts", type=click.IntRange(1, 1001), metavar="N",
                 help="The same counted as deliveries (pop consumers, RocketMQ 5): N = max-reconsume-times + 1."),
    click.option("--retry-delays", callback=_delays, metavar="LIST",
                 help="Backoff of each retry, e.g. 10s,30s,1m,2h (the last repeats; default RocketMQ's 10s ... 2h)."),
    click.option("--fifo/--no-fifo", default=None, help="Consumers process each queue (message group) in order."),
)


def _setting_options(command: Any) -> Any:
    """The group setting options of ``group create`` and ``group config``, stacked."""
    for option in reversed(_SETTING_OPTIONS):
        command = option(command)
    return command


def _setting_changes(max_reconsume_times: int | None, max_delivery_attempts: int | None,
                     retry_delays: list[int] | None, fifo: bool | None) -> dict[str, Any]:
    """The settings given on the command line, as ``Admin.set_group_settings`` takes them."""
    if max_reconsume_times is not None and max_delivery_attempts is not None:
        raise click.UsageError("give --max-reconsume-times or --max-delivery-attempts, not both")
    if max_delivery_attempts is not None:
        max_reconsume_times = max_delivery_attempts - 1
    return {k: v for k, v in (("max_reconsume_times", max_reconsume_times), ("retry_delays_ms", retry_delays),
                              ("fifo", fifo)) if v is not None}


@group.command()
@click.argument("group_name", metavar="GROUP")
@_setting_options
@nameserver_option
@json_option
def create(group_name: str, nameserver: str, as_json: bool, **setting_options: Any) -> None:
    """Create GROUP with its settings (RocketMQ's subscription group: retries, dead letters, FIFO);
    the ones not given take their defaults. Refused if GROUP exists (has settings, or a broker
    knows it): change it with `gms group config`."""
    changes = _setting_changes(**setting_options)
    with open_admin(nameserver) as admin:
        if group_name in admin.groups():
            raise click.ClickException(f"consumer group {group_name} already exists (it has consumed): change its"
                                       f" settings with `gms group config {group_name}`")
        settings = admin.set_group_settings(group_name, create=True, **changes)
    _show_settings(group_name, settings, as_json)


@group.command(name="config")
@click.argument("group_name", metavar="GROUP")
@_setting_options
@click.option("--reset", is_flag=True, help="Drop the group's settings: its consumers use the defaults.")
@nameserver_option
@json_option
def config(group_name: str, reset: bool, nameserver: str, as_json: bool, **setting_options: Any) -> None:
    """Show or set GROUP's settings (kept by the nameservers): retries, dead letters, FIFO. Its
    consumers use them unless given their own; a consumer reads them when it starts."""
    changes = _setting_changes(**setting_options)
    if reset and changes:
        raise click.UsageError("--reset drops every setting: give no others with it")
    with open_admin(nameserver) as admin:
        if reset:
            admin.delete_group_settings(group_name)
            settings = None
        elif changes:
            settings = admin.set_group_settings(group_name, **changes)
        else:
            settings = admin.group_settings(group_name)
    _show_settings(group_name, settings, as_json)


def _show_settings(group_name: str, settings: GroupSettings | None, as_json: bool) -> None:
    """A group's settings (None: it has none of its own, the defaults hold)."""
    shown = (settings or GroupSettings()).to_dict()
    if as_json:
        print_json({"group": group_name, "own": settings is not None, **shown})
        return
    origin = "" if settings is not None else "  (the defaults: the group has no settings of its own)"
    click.echo(f"group {group_name}{origin}")
    click.echo(f"  max reconsume times  {shown['max_reconsume_times']} "
               f"(max delivery attempts {shown['max_reconsume_times'] + 1})")
    click.echo(f"  retry delays         {', '.join(_delay_text(d) for d in shown['retry_delays_ms'])}")
    click.echo(f"  fifo                 {'yes' if shown['fifo'] else 'no'}")


def _delay_text(ms: int) -> str:
    for unit in ("h", "m", "s"):
        if ms and ms % _UNITS_MS[unit] == 0:
            return f"{ms // _UNITS_MS[unit]}{unit}"
    return f"{ms}ms"
