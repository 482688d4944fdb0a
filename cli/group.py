"""``gms group``: consumer groups — list them, describe members, assignment and lag."""

from __future__ import annotations

from typing import Any

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import print_json, show, table, time_text
from gms.client import Admin
from gms.errors import TopicNotFoundError

NO_COMMIT = -1


@click.group()
def group() -> None:
    """List consumer groups and show their members, assignment and lag."""


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


def group_lag(admin: Admin, described: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per queue the group committed on or is assigned: committed, max offset, lag."""
    owners = {(m["broker"], topic, q): m["member"] for m in described["members"] for topic, q in m["queues"]}
    keys = set(owners)
    for broker, topics in described["offsets"].items():
        keys.update((broker, topic, q) for topic, queues in topics.items() for q in queues)
    max_offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
    for topic in sorted({t for _, t, _ in keys}):
        try:
            stats = admin.topic_stats(topic)
        except TopicNotFoundError:
            continue  # deleted since: its committed offsets are shown without a max
        max_offsets.update({(s["broker"], topic, s["queue_id"]): (s["min_offset"], s["max_offset"]) for s in stats})
    rows = []
    for broker, topic, q in sorted(keys, key=lambda k: (k[1], k[2], k[0])):
        committed = described["offsets"].get(broker, {}).get(topic, {}).get(q, NO_COMMIT)
        low, high = max_offsets.get((broker, topic, q), (None, None))
        # Nothing committed yet: everything still in the queue is behind.
        lag = None if high is None else high - (committed if committed >= 0 else low)
        rows.append({"topic": topic, "queue_id": q, "broker": broker, "member": owners.get((broker, topic, q)),
                     "committed": committed if committed >= 0 else None, "max_offset": high, "lag": lag})
    return rows


@group.command()
@click.argument("group_name", metavar="GROUP")
@nameserver_option
@json_option
def describe(group_name: str, nameserver: str, as_json: bool) -> None:
    """Show GROUP's members, which queues each holds, committed and max offsets, and the lag."""
    with open_admin(nameserver) as admin:
        described = admin.group_describe(group_name)
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
