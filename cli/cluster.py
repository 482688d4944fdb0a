"""``gms cluster`` and ``gms msg``: looking at the cluster's health and single messages."""

from __future__ import annotations

from typing import Any

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import TimeParam, json_option, nameserver_option
from gms.cli.output import error_text, print_json, show, size_text, table, time_text
from gms.client.display import body_text, message_dict
from gms.client.routing import NameserversUnavailableError
from gms.errors import GmsError, MessageNotFoundError, TopicNotFoundError
from gms.msgid import decode_msg_id
from gms.record.layout import DELIVER_AT_PROPERTY, KEY_SEPARATOR, ORIGIN_PROPERTY


@click.command()
@nameserver_option
@json_option
@click.option("--check", is_flag=True, help="Print nothing but `ok`, or the problems one per line and exit with 1"
                                           " (for scripts and container health checks).")
@click.pass_context
def cluster(ctx: click.Context, nameserver: str, as_json: bool, check: bool) -> None:
    """Show nameservers, brokers (alive, address, topics, disk use) and etcd health.

    Exits with 1 and says why when no nameserver answers, etcd is unhealthy, no broker is
    registered, a registered broker does not answer or its store is read-only (a failed disk
    flush) or full, a queue has no live leader or a queue's ISR is below its minimum."""
    if check:
        if as_json:
            raise click.UsageError("--check prints problems only; leave out --json")
        problems = _check(nameserver)
        click.echo("\n".join(problems) or "ok")
        ctx.exit(1 if problems else 0)
    status, rows, problems = _survey(nameserver)
    etcd = status["etcd"]
    controller = status.get("controller") or {}
    if as_json:
        print_json({"etcd": etcd, "nameservers": status["nameservers"], "controller": controller,
                    "brokers": rows, "topics": status["topics"], "queues": _queues(status), "problems": problems,
                    "healthy": not problems})
    else:
        show(
            table("nameservers", ["address", "started", "controller"],
                  [(n["address"], time_text(n["started_ms"]),
                    f"yes (epoch {controller.get('epoch')})" if n["address"] == controller.get("id") else "")
                   for n in status["nameservers"]]),
            table(f"brokers ({status['topics']} topics in the cluster)",
                  ["broker", "address", "cluster", "alive", "store", "topics", "disk used", "uptime"],
                  [(r["broker_id"], r["address"], r["cluster"], "yes" if r["alive"] else "NO", r["store_health"],
                    r["topics"], size_text(r["disk_used_bytes"]),
                    None if r["uptime_s"] is None else f"{r['uptime_s']:.0f} s")
                   for r in rows]),
            table("etcd", ["endpoints", "healthy", "version / error"],
                  [(etcd["endpoints"], "yes" if etcd["healthy"] else "NO", etcd.get("version") or etcd.get("error"))]),
        )
    if problems:
        raise click.ClickException("; ".join(problems))


def _check(nameserver: str) -> list[str]:
    """The cluster's problems; a nameserver that cannot be asked is one too."""
    try:
        return _survey(nameserver)[2]
    except NameserversUnavailableError as err:
        return ["no nameserver answers: " + "; ".join(err.failures)]
    except GmsError as err:
        return [f"cannot ask the nameserver at {nameserver}: {error_text(err)}"]


def _queues(status: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return status.get("queues") or {"without_leader": [], "under_min_isr": []}


def _survey(nameserver: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The nameserver's CLUSTER_STATUS, a row per registered broker with its own BROKER_STATUS
    answer, and the problems found in both."""
    with open_admin(nameserver) as admin:
        status = admin.cluster_status()
        brokers = {b["address"]: b for b in status["brokers"]}
        answers = {s["address"]: s for s in admin.broker_status()}
    rows = []
    for address, info in sorted(brokers.items()):
        answer = answers.get(address, {"error": "not asked"})
        rows.append({**info, "alive": "error" not in answer, "topics": answer.get("topics"),
                     "disk_used_bytes": answer.get("disk_used_bytes"), "uptime_s": answer.get("uptime_s"),
                     "store_health": answer.get("store_health"), "error": answer.get("error")})
    etcd = status["etcd"]
    problems = ([] if etcd["healthy"] else [f"etcd unhealthy: {etcd.get('error', '')}"]) + [
        f"broker {r['address']} does not answer: {r['error']}" for r in rows if not r["alive"]]
    problems += [f"broker {r['address']} store is {r['store_health']}: {_STORE_TROUBLE[r['store_health']]}"
                 for r in rows if r["store_health"] in _STORE_TROUBLE]
    problems += _queue_problems(_queues(status))
    if not rows:
        problems.append("no broker is registered: start one with `gms-broker --nameserver ...`")
    return status, rows, problems


_STORE_TROUBLE = {  # BROKER_STATUS store_health values that need an operator
    "read_only": "a disk flush failed, it refuses writes until restarted; check the disk first",
    "disk_full": "the disk is full: sends that need more space fail (nothing acknowledged is lost);"
                 " free space or shorten retention",
}
QUEUES_LISTED_MAX = 8  # a whole dead broker's queues would drown the message


def _queue_problems(queues: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per kind of queue trouble the nameserver reported, naming the first queues."""

    def listed(items: list[str]) -> str:
        more = f" and {len(items) - QUEUES_LISTED_MAX} more" if len(items) > QUEUES_LISTED_MAX else ""
        return ", ".join(items[:QUEUES_LISTED_MAX]) + more

    problems = []
    if queues["without_leader"]:
        problems.append(f"{len(queues['without_leader'])} queue(s) without a live leader (sends fail): " + listed(
            [f"{q['topic']}/{q['queue_id']} (leader {q['leader'] or 'none'})" for q in queues["without_leader"]]))
    if queues["under_min_isr"]:
        problems.append(f"{len(queues['under_min_isr'])} queue(s) with fewer in-sync replicas than their minimum"
                        " (acks=-1 sends fail): " + listed(
            [f"{q['topic']}/{q['queue_id']} (isr {','.join(q['isr'])}, min {q['min_insync_replicas']})"
             for q in queues["under_min_isr"]]))
    return problems


@click.group()
def msg() -> None:
    """Look at single messages."""


@msg.command(name="cancel")
@click.argument("msg_id")
@nameserver_option
def cancel_message(msg_id: str, nameserver: str) -> None:
    """Recall the scheduled message MSG_ID before its time (`gms produce --delay` prints ids)."""
    try:
        decode_msg_id(msg_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="MSG_ID") from err
    with open_admin(nameserver) as admin:
        admin.cancel_scheduled(msg_id)
    click.echo(f"cancelled {msg_id}: it will not be delivered")


def _delivery_rows(properties: dict[str, str]) -> list[tuple[str, str]]:
    """When a scheduled message is (or was) delivered."""
    at = properties.get(DELIVER_AT_PROPERTY)
    if at is None or not at.lstrip("-").isdigit():
        return []
    origin = properties.get(ORIGIN_PROPERTY)
    what = (f"delivered copy of the scheduled message at offset {origin}" if origin is not None
            else "scheduled: consumers receive a copy then (`gms msg cancel` recalls it before)")
    return [("deliver at", f"{time_text(int(at))} ({what})")]


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
        try:
            found = admin.view_message(msg_id)
        except MessageNotFoundError as err:  # expired, never written, or not a record's start
            raise click.ClickException(f"no message with id {msg_id} on broker {located.address} ({err})") from err
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
            *_delivery_rows(record["properties"]),
            ("body", f"{len(found.body)} bytes")]
    show(table(None, ["field", "value"], rows))
    click.echo(body_text(found.body))


FIND_MESSAGES_MAX = 1024  # what one broker answers at most (FIND_BY_KEY)


@msg.command(name="find")
@click.option("--topic", "-t", required=True, help="The topic to search.")
@click.option("--key", "-k", required=True, help="A message key (as the producer set it; one key, no spaces).")
@click.option("--from", "begin_ms", type=TimeParam(), help="Stored at or after this time: epoch ms or ISO 8601"
                                                         " (no zone = UTC).")
@click.option("--to", "end_ms", type=TimeParam(), help="Stored at or before this time.")
@click.option("--max", "max_messages", type=click.IntRange(1, FIND_MESSAGES_MAX), default=32, show_default=True,
              help="Show at most this many (the newest).")
@nameserver_option
@json_option
def find_message(topic: str, key: str, begin_ms: int | None, end_ms: int | None, max_messages: int,
                 nameserver: str, as_json: bool) -> None:
    """Find the messages of a topic by key, through the brokers' key index (oldest first).

    Exits with 1 when the topic is unknown or no message carries the key."""
    if not key or KEY_SEPARATOR in key:
        raise click.BadParameter("one key, not empty and without spaces", param_hint="--key")
    with open_admin(nameserver) as admin:
        try:
            found = admin.find_by_key(topic, key, begin_ms=begin_ms, end_ms=end_ms, max_messages=max_messages)
        except TopicNotFoundError as err:
            raise click.ClickException(f"topic {topic!r} does not exist ({err})") from err
        records = [message_dict(m) for m in found]
    if not found:
        span = ("" if begin_ms is None and end_ms is None
                else f" stored from {time_text(begin_ms)} to {time_text(end_ms)}")
        raise click.ClickException(f"no message of topic {topic!r} with key {key!r}{span}")
    if as_json:
        print_json(records)
        return
    show(table(f"{len(found)} message(s) of {topic} with key {key}",
               ["stored", "msg id", "queue", "offset", "tag", "keys", "body"],
               [(time_text(r["store_timestamp_ms"]), r["msg_id"], r["queue_id"], r["queue_offset"], r["tag"],
                 ", ".join(r["keys"]), body_text(m.body)) for r, m in zip(records, found, strict=True)]))
