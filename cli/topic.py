"""``gms topic create|update|delete|list|describe``: cluster topics through the nameserver."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import (
    json_option,
    nameserver_option,
    queues_option,
    topic_argument,
    topic_setting_options,
    topic_settings,
)
from gms.cli.output import error_text, print_json, show, table
from gms.client.admin import TopicResult, TopicSpec
from gms.naming import is_group_topic


@click.group()
def topic() -> None:
    """Create, change, delete, list and describe topics."""


def _route_table(route: dict[str, Any]) -> Any:
    rows = [(q["queue_id"], q["leader"], ", ".join(q["replicas"]), q["leader_epoch"]) for q in route["queues"]]
    return table(f"topic {route['topic']}", ["queue", "leader", "replicas", "epoch"], rows)


def _settings_table(answer: dict[str, Any]) -> Any:
    """A topic's settings as the nameserver holds them (an unset retention is the broker's)."""
    settings = answer["settings"]
    retention = settings["retention_ms"]
    rows = [
        ("replication factor", answer["replication_factor"]),
        ("retention", "broker default (gms-broker --retention-hours)" if retention is None
         else f"{retention} ms ({duration_text(retention)})"),
        ("message size max", f"{settings['message_size_bytes_max']} bytes"),
        ("min in-sync replicas", settings["min_insync_replicas"]),
        ("unclean leader election", "on" if settings["unclean_leader_election"] else "off"),
        ("message type", settings["message_type"]),
        ("cleanup", settings.get("cleanup_policy", "delete")),
    ]
    if "compact" in settings.get("cleanup_policy", "delete"):
        rows += [("min compaction lag", f"{settings['min_compaction_lag_ms']} ms"),
                 ("dirty ratio", settings["dirty_ratio"]),
                 ("tombstone retention", f"{settings['tombstone_retention_ms']} ms"
                                         f" ({duration_text(settings['tombstone_retention_ms'])})"),
                 ("segment roll", f"{settings['segment_roll_messages']} messages")]
    return table("settings", ["setting", "value"], rows)


def duration_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:g} {unit}"
    return f"{ms} ms"


@topic.command()
@click.argument("topics", metavar="TOPIC...", nargs=-1, required=True)
@queues_option
@click.option("--replicas", "-r", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Copies of each queue, on different brokers.")
@topic_setting_options
@nameserver_option
@json_option
@click.pass_context
def create(ctx: click.Context, topics: tuple[str, ...], queues: int | None, replicas: int, nameserver: str,
           as_json: bool, **setting_options: Any) -> None:
    """Create TOPIC (several: all in one request); the queues are spread over the live brokers.
    Settings not given take their defaults. With several topics, a line per topic; one that
    cannot be created (exists, invalid name) does not stop the others, and the exit code is 1."""
    settings = topic_settings(**setting_options)
    with open_admin(nameserver) as admin:
        if len(topics) > 1:
            specs = [TopicSpec(name, queues or 8, settings, replicas) for name in topics]
            results = admin.create_topics(specs)
        else:
            route = admin.create_topic(topics[0], queues or 8, replicas=replicas, settings=settings)
    if len(topics) > 1:
        _show_created(results, as_json)
        ctx.exit(0 if all(r.created for r in results) else 1)
    if as_json:
        print_json(route)
        return
    brokers = {q["leader"] for q in route["queues"]}
    click.echo(f"created topic {topics[0]}: {len(route['queues'])} queues on {len(brokers)} broker(s)")
    show(_route_table(route), _settings_table(route))


def _show_created(results: list[TopicResult], as_json: bool) -> None:
    """A line per topic of a many-topic create (the failed ones on stderr), or a JSON list."""
    _show_many("create", results, as_json, lambda r: {
        "created": r.created, "queues": r.queues, "replication_factor": r.replication_factor,
        "brokers": list(r.brokers)}, lambda r: f"{r.queues} queues on {len(r.brokers)} broker(s)")


def _show_many(verb: str, results: list[TopicResult], as_json: bool,
               json_fields: Callable[[TopicResult], dict[str, Any]],
               detail: Callable[[TopicResult], str] | None = None) -> None:
    """What became of each topic of a many-topic ``verb`` (create, delete): a line per topic
    (the failed ones on stderr) and a count, or a JSON list."""
    if as_json:
        print_json([{"topic": r.topic, **json_fields(r), "error": None if r.error is None else str(r.error)}
                    for r in results])
        return
    for r in results:
        if r.error is None:
            click.echo(f"{verb}d topic {r.topic}" + (f": {detail(r)}" if detail is not None else ""))
        else:
            click.echo(f"cannot {verb} topic {r.topic}: {error_text(r.error)}", err=True)
    failed = sum(r.error is not None for r in results)
    click.echo(f"{len(results) - failed} of {len(results)} topics {verb}d", err=bool(failed))


@topic.command()
@topic_argument
@queues_option
@topic_setting_options
@nameserver_option
@json_option
def update(topic: str, queues: int | None, nameserver: str, as_json: bool, **setting_options: Any) -> None:
    """Grow TOPIC's queue count and/or change the settings given; the others stay as they are."""
    settings = topic_settings(**setting_options)
    if queues is None and not settings:
        raise click.UsageError("nothing to update: give --queues or a setting option (see --help)")
    with open_admin(nameserver) as admin:
        route = admin.update_topic(topic, queues, settings=settings)
    if as_json:
        print_json(route)
        return
    click.echo(f"updated topic {topic}: {len(route['queues'])} queues")
    show(_route_table(route), _settings_table(route))


@topic.command()
@click.argument("topics", metavar="TOPIC...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@nameserver_option
@json_option
@click.pass_context
def delete(ctx: click.Context, topics: tuple[str, ...], yes: bool, nameserver: str, as_json: bool) -> None:
    """Delete TOPIC from the cluster (its messages go with it). Several: their requests go
    together, a line per topic; one that cannot be deleted (no such topic) does not stop the
    others, and the exit code is 1."""
    if not yes:
        what = f"topic {topics[0]}" if len(topics) == 1 else f"{len(topics)} topics ({', '.join(topics[:5])}" \
            f"{', ...' if len(topics) > 5 else ''})"
        click.confirm(f"Delete {what} and all {'its' if len(topics) == 1 else 'their'} messages?", abort=True,
                      err=True)
    with open_admin(nameserver) as admin:
        if len(topics) > 1:
            results = admin.delete_topics(topics)
        else:
            admin.delete_topic(topics[0])
    if len(topics) > 1:
        _show_many("delete", results, as_json, lambda r: {"deleted": r.deleted})
        ctx.exit(0 if all(r.deleted for r in results) else 1)
    if as_json:
        print_json({"deleted": topics[0]})
    else:
        click.echo(f"deleted topic {topics[0]}")


@topic.command(name="list")
@click.option("--all", "show_all", is_flag=True,
              help="Also the consumer groups' own topics (%RETRY%<group>, %DLQ%<group>).")
@nameserver_option
@json_option
def list_topics(show_all: bool, nameserver: str, as_json: bool) -> None:
    """List the cluster's topics and their queue counts (without the consumer groups' retry and
    dead-letter topics unless --all)."""
    with open_admin(nameserver) as admin:
        topics = {name: queues for name, queues in admin.topics().items() if show_all or not is_group_topic(name)}
    if as_json:
        print_json(topics)
    elif not topics:
        click.echo("no topics yet: create one with `gms topic create NAME`")
    else:
        show(table(None, ["topic", "queues"], sorted(topics.items())))


@topic.command()
@topic_argument
@nameserver_option
@json_option
def describe(topic: str, nameserver: str, as_json: bool) -> None:
    """Show TOPIC's settings and queues: broker, offsets and message counts, and a summary per
    broker."""
    with open_admin(nameserver) as admin:
        route = admin.route(topic, settings=True)
        stats = {s["queue_id"]: s for s in admin.topic_stats(topic)} if _has_live_queue(route) else {}
    queues = []
    per_broker: dict[str, dict[str, int]] = defaultdict(lambda: {"queues": 0, "messages": 0})
    for q in route["queues"]:
        stat = stats.get(q["queue_id"], {})
        low, high = stat.get("min_offset"), stat.get("max_offset")
        count = None if low is None or high is None else high - low
        queues.append({**q, "min_offset": low, "max_offset": high, "messages": count})
        summary = per_broker[q["leader"] or "(no live broker)"]
        summary["queues"] += 1
        summary["messages"] += count or 0
    if as_json:
        print_json({"topic": topic, "replication_factor": route["replication_factor"],
                    "settings": route["settings"], "queues": queues, "brokers": dict(per_broker)})
        return
    rows = [(q["queue_id"], q["leader"], ", ".join(q["replicas"]), q["leader_epoch"],
             q["min_offset"], q["max_offset"], q["messages"]) for q in queues]
    total = sum(s["messages"] for s in per_broker.values())
    show(_settings_table(route),
         table(f"topic {topic}: {len(queues)} queues, {total} messages",
               ["queue", "leader", "replicas", "epoch", "min", "max", "messages"], rows),
         table("per broker", ["broker", "queues", "messages"],
               [(b, s["queues"], s["messages"]) for b, s in sorted(per_broker.items())]))


def _has_live_queue(route: dict[str, Any]) -> bool:
    return any(q["leader"] for q in route["queues"])
