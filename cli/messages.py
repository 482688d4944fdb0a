"""``gms produce`` and ``gms tail``: messages in from arguments, stdin or a file; messages out
as text lines or JSON lines."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from gms.cli.admin_context import client_security
from gms.cli.interrupts import INTERRUPTED_EXIT_CODE, stop_requested
from gms.cli.options import TimeParam, json_option, nameserver_option, topic_argument
from gms.cli.output import console, error_text, message_line, print_json
from gms.client import Consumer, DamagedRecord, Producer, SendFuture, SendResult, SimpleConsumer, Sql
from gms.client.display import message_dict

# How many results `gms produce` lists one by one before it only prints a summary.
RESULTS_LISTED_MAX = 10
POLL_MS = 200
# Without --follow, tail stops once nothing new arrived for this long (all caught up).
IDLE_STOP_S = 1.5
TAIL_GROUP_PREFIX = "gms-tail-"


def _parse_property(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    properties = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not k=v")
        properties[name] = value
    return properties


@click.command()
@topic_argument
@click.argument("messages", nargs=-1)
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Send each line of this file as one message.")
@click.option("--tag", help="Tag of every message (consumers filter on it).")
@click.option("--key", "-k",
              help="Message key, stored with each message; messages with the same key go to the same queue (in order). "
                   "Indexed: `gms msg find --key` finds the messages.")
@click.option("--property", "properties", multiple=True, callback=_parse_property, metavar="K=V",
              help="A message property (repeatable).")
@nameserver_option
@click.option("--delay", "delay_s", type=click.FloatRange(min=0),
              help="Deliver to consumers this many seconds from now (stored at once; up to 7 days).")
@click.option("--deliver-at", type=TimeParam(),
              help="Deliver to consumers at this time: epoch ms or ISO 8601 (no zone = UTC; Z and +hh:mm accepted),"
                   " stored at once, up to 7 days ahead.")
@json_option
def produce(topic: str, messages: tuple[str, ...], file: Path | None, tag: str | None, key: str | None,
            properties: dict[str, str], nameserver: str, delay_s: float | None, deliver_at: int | None,
            as_json: bool) -> None:
    """Send MESSAGES to TOPIC; without any, send each line of --file or of stdin (empty lines skipped)."""
    if messages and file is not None:
        raise click.UsageError("give messages as arguments or --file, not both")
    if delay_s is not None and deliver_at is not None:
        raise click.UsageError("give --delay or --deliver-at, not both")
    keys = (key,) if key else ()
    results: list[SendFuture] = []
    delay_ms = round(delay_s * 1000) if delay_s is not None else None
    with Producer(nameserver=nameserver, security=client_security()) as producer:
        try:
            for body in _bodies(messages, file):
                try:
                    results.append(producer.send_async(topic, body, tag=tag, keys=keys, properties=properties or None,
                                                       key=key, delay_ms=delay_ms, deliver_at=deliver_at))
                except ValueError as err:
                    raise click.BadParameter(str(err)) from err
        finally:
            producer.flush()
    _report(topic, results, as_json)


def _bodies(messages: tuple[str, ...], file: Path | None) -> Iterator[bytes]:
    if messages:
        yield from (m.encode() for m in messages)
    elif file is not None:
        with open(file, "rb") as stream:
            yield from _file_lines(stream, file.stat().st_size)
    else:
        if sys.stdin.isatty():
            click.echo("reading messages from stdin, one per line (Ctrl-D ends)", err=True)
        yield from _lines(sys.stdin.buffer)


def _file_lines(stream: IO[bytes], size_bytes: int) -> Iterator[bytes]:
    progress = Progress(TextColumn("sending"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                        console=console(stderr=True), disable=not sys.stderr.isatty(), transient=True)
    with progress:
        task = progress.add_task("send", total=size_bytes)
        for line in _lines(stream):
            progress.advance(task, len(line) + 1)
            yield line


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for raw in stream:
        line = raw.rstrip(b"\r\n")
        if line:
            yield line


def _report(topic: str, futures: list[SendFuture], as_json: bool) -> None:
    sent: list[SendResult] = []
    errors: list[BaseException] = []
    for future in futures:
        err = future.exception()
        if err is None:
            sent.append(future.result())
        else:
            errors.append(err)
    if as_json:
        print_json({"topic": topic, "sent": len(sent), "failed": len(errors),
                    "results": [r._asdict() for r in sent], "errors": sorted({str(e) for e in errors})})
    else:
        if len(sent) <= RESULTS_LISTED_MAX:
            for result in sent:
                click.echo(f"{result.msg_id}  {result.topic}/{result.queue_id}@{result.queue_offset}")
        click.echo(f"sent {len(sent)} message(s) to {topic}", err=len(sent) <= RESULTS_LISTED_MAX and bool(sent))
    if errors:
        first = errors[0]
        raise click.ClickException(
            f"{len(errors)} message(s) failed; first error: {error_text(first)}")
    if not sent:
        raise click.ClickException("no messages to send (empty input)")


class StartFrom(click.ParamType):
    """``first``, ``last``, or a time as :class:`TimeParam` reads it (no zone = UTC)."""

    name = "first|last|TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | int:
        if value in ("first", "last"):
            return str(value)
        try:
            return TimeParam().convert(value, param, ctx)
        except click.BadParameter as err:
            self.fail(f"not first or last, and {err.message}", param, ctx)


@click.command()
@topic_argument
@click.option("--tag", "tag_expression", default="*", show_default=True, metavar="EXPR",
              help="Tag expression, e.g. 'created || paid'.")
@click.option("--sql", metavar="EXPR",
              help="SQL92 filter over properties and TAGS, e.g. \"region = 'eu' AND amount > 100\" (docs/filters.md);"
                   " instead of --tag.")
@click.option("--from", "start_from", type=StartFrom(),
              help="Where to start: first, last, or a time: epoch ms or ISO 8601 (no zone = UTC; Z and +hh:mm "
                   "accepted). Default: first, or last with --follow.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new messages (Ctrl-C stops).")
@click.option("--group", "-g",
              help="Read as this consumer group (shares queues with its other members, commits offsets).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one line per message; json: one JSON object per line.")
@click.option("--count", "-c", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--pop", is_flag=True,
              help="Receive as a pop consumer of --group: messages are handed out one by one to the group's "
                   "consumers, each acknowledged once printed (docs/pop.md).")
@nameserver_option
def tail(topic: str, tag_expression: str, sql: str | None, start_from: str | int | None, follow: bool,
         group: str | None, fmt: str, count: int | None, pop: bool, nameserver: str) -> None:
    """Print TOPIC's messages: where each is (topic/queue@offset), its tag, keys and body."""
    if start_from is None:
        start_from = "last" if follow else "first"
    if sql is not None and (tag_expression != "*" or pop):
        raise click.UsageError("--sql filters on its own (name the tag in it as TAGS = '...'), and not with --pop")
    if pop:
        if not group:
            raise click.UsageError("--pop needs --group: the consumer group the messages are handed out to")
        _tail_popped(topic, tag_expression, start_from, follow, group, fmt, count, nameserver)
        return
    consumer = Consumer(
        nameserver=nameserver, group=group or f"{TAIL_GROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}",
        subscription={topic: Sql(sql) if sql is not None else tag_expression},
        mode="clustering" if group else "broadcasting",
        start_from=start_from, auto_commit=bool(group),
        # A group commits what poll returned: take no more than will be printed.
        max_poll_messages=1 if group and count else 1024,
        on_damaged=lambda record: click.echo(_damaged_line(record, fmt)),
        security=client_security(),
    )
    with stop_requested() as stop:
        try:
            shown = _print_messages(consumer, fmt, count, follow, stop)
        finally:
            consumer.close()
    if stop.is_set():
        raise click.exceptions.Exit(INTERRUPTED_EXIT_CODE)
    if fmt == "text" and not follow and count is None and shown == 0:
        wanted = sql if sql is not None else tag_expression
        click.echo(f"no messages in {topic}" + ("" if wanted == "*" else f" matching {wanted!r}"), err=True)


def _tail_popped(topic: str, tag_expression: str, start_from: str | int, follow: bool, group: str, fmt: str,
                 count: int | None, nameserver: str) -> None:
    consumer = SimpleConsumer(nameserver=nameserver, group=group, subscription={topic: tag_expression},
                              start_from=start_from, await_duration_ms=POLL_MS, security=client_security())
    shown = 0
    last_seen = time.monotonic()
    with stop_requested() as stop:
        try:
            while (count is None or shown < count) and not stop.is_set():
                messages = consumer.receive(min(32, count - shown) if count is not None else 32)
                if messages:
                    last_seen = time.monotonic()
                elif not follow and time.monotonic() - last_seen >= IDLE_STOP_S:
                    break
                for msg in messages:
                    click.echo(message_line(msg) + f"  attempt={msg.delivery_attempt}" if fmt == "text"
                               else json.dumps({**message_dict(msg), "delivery_attempt": msg.delivery_attempt},
                                               sort_keys=True))
                consumer.ack(messages)
                shown += len(messages)
        finally:
            consumer.close()
    if stop.is_set():
        raise click.exceptions.Exit(INTERRUPTED_EXIT_CODE)


def _print_messages(consumer: Consumer, fmt: str, count: int | None, follow: bool, stop: threading.Event) -> int:
    shown = 0
    last_seen = time.monotonic()
    while (count is None or shown < count) and not stop.is_set():
        messages = consumer.poll(POLL_MS)
        if messages:
            last_seen = time.monotonic()
        elif not follow and time.monotonic() - last_seen >= IDLE_STOP_S:
            break
        for msg in messages[: None if count is None else count - shown]:
            click.echo(message_line(msg) if fmt == "text" else _json_line(msg))
            shown += 1
    return shown


def _json_line(msg: Any) -> str:
    return json.dumps(message_dict(msg), sort_keys=True)


def _damaged_line(record: DamagedRecord, fmt: str) -> str:
    """A damaged record (CRC mismatch on the broker; passed, never shown as a message)."""
    if fmt == "json":
        return json.dumps({"damaged": True, **record._asdict()}, sort_keys=True)
    return (f"{record.topic}/{record.queue_id}@{record.queue_offset}  DAMAGED (CRC mismatch on the broker, "
            f"skipped) id={record.msg_id}")

