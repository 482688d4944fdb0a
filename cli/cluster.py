"""``gms group``, ``gms cluster`` and ``gms msg``: looking at consumer groups, the cluster's
health and single messages."""

from __future__ import annotations

from typing import Any

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import body_text, message_dict, print_json, show, size_text, table, time_text
from gms.client import Admin
from gms.errors import TopicNotFoundError
from gms.msgid import decode_msg_id

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
        table(f"group {group_name}: {len(members)} member(s)", ["member", "mode", "subscription", "queues", "last seen"],
              [(m["member"], m["mode"], ", ".join(f"{t}: {e}" for t, e in m["subscription"].items()),
                ", ".join(f"{t}/{q}" for t, q in m["queues"]), time_text(m["last_seen_ms"]))
               for m in members.values()]),
        table(f"total lag {total}", ["topic", "queue", "broker", "member", "committed", "max", "lag"],
              [(r["topic"], r["queue_id"], r["broker"], r["member"], r["committed"], r["max_offset"], r["lag"])
               for r in rows]),
    )


@click.command()
@nameserver_option
@json_option
def cluster(nameserver: str, as_json: bool) -> None:
    """Show nameservers, brokers (alive, address, topics, disk use) and etcd health.

    Exits with 1 when etcd is unhealthy or a registered broker does not answer."""
    with open_admin(nameserver) as admin:
        status = admin.cluster_status()
        brokers = {b["address"]: b for b in status["brokers"]}
        answers = {s["address"]: s for s in admin.broker_status()}
    rows = []
    for address, info in sorted(brokers.items()):
        answer = answers.get(address, {"error": "not asked"})
        rows.append({**info, "alive": "error" not in answer, "topics": answer.get("topics"),
                     "disk_used_bytes": answer.get("disk_used_bytes"), "uptime_s": answer.get("uptime_s"),
                     "error": answer.get("error")})
    etcd = status["etcd"]
    problems = ([] if etcd["healthy"] else [f"etcd unhealthy: {etcd.get('error', '')}"]) + [
        f"broker {r['address']} does not answer: {r['error']}" for r in rows if not r["alive"]]
    controller = status.get("controller") or {}
    if as_json:
        print_json({"etcd": etcd, "nameservers": status["nameservers"], "controller": controller,
                    "brokers": rows, "topics": status["topics"], "healthy": not problems})
    else:
        show(
            table("nameservers", ["address", "started", "controller"],
                  [(n["address"], time_text(n["started_ms"]),
                    f"yes (epoch {controller.get('epoch')})" if n["address"] == controller.get("id") else "")
                   for n in status["nameservers"]]),
            table(f"brokers ({status['topics']} topics in the cluster)",
                  ["broker", "address", "cluster", "alive", "topics", "disk used", "uptime"],
                  [(r["broker_id"], r["address"], r["cluster"], "yes" if r["alive"] else "NO", r["topics"],
                    size_text(r["disk_used_bytes"]), None if r["uptime_s"] is None else f"{r['uptime_s']:.0f} s")
                   for r in rows]),
            table("etcd", ["endpoints", "healthy", "version / error"],
                  [(etcd["endpoints"], "yes" if etcd["healthy"] else "NO", etcd.get("version") or etcd.get("error"))]),
        )
    if problems:
        raise click.ClickException("; ".join(problems))


@click.group()
def msg() -> None:
    """Look at single messages."""


@msg.command(name="show")
@click.argument("msg_id")
@nameserver_option
@json_option
def show_message(msg_id: str, nameserver: str, as_json: bool) -> None:
    """Show the message MSG_ID (asks the broker the id names)."""
    try:
        located = decode_msg_id(msg_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="MSG_ID") from err
    with open_admin(nameserver) as admin:
        found = admin.view_message(msg_id)
        record = message_dict(found)
    if as_json:
        print_json(record)
        return
    rows = [("msg id", record["msg_id"]), ("broker", located.address),
            ("topic / queue / offset", f"{record['topic']} / {record['queue_id']} / {record['queue_offset']}"),
            ("tag", record["tag"]), ("keys", ", ".join(record["keys"])),
            ("properties", ", ".join(f"{k}={v}" for k, v in record["properties"].items())),
            ("born", f"{time_text(record['born_timestamp_ms'])} from {record['born_host'] or '-'}"),
            ("stored", time_text(record["store_timestamp_ms"])),
            ("body", f"{len(found.body)} bytes")]
    show(table(None, ["field", "value"], rows))
    click.echo(body_text(found.body))
