"""``gms dlq``: a consumer group's dead letters — the messages it failed too often."""

from __future__ import annotations

import os
import time
import uuid

import click

from gms.cli.admin_context import client_security, open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import print_json, show, table, time_text
from gms.client import Consumer, Producer, ReceivedMessage
from gms.client.display import body_text
from gms.client.retries import DLQ_REASON_PROPERTY, ORIGIN_MSG_ID_PROPERTY, ORIGIN_TOPIC_PROPERTY, origin_topic
from gms.errors import TopicNotFoundError
from gms.naming import dlq_topic, retry_topic

READ_IDLE_S = 1.0  # the dead letters are all read once nothing more came for this long
BODY_PREVIEW_CHARS = 40


@click.group()
def dlq() -> None:
    """List, show and resend a consumer group's dead letters (docs/retries.md)."""


def _dead_letters(nameserver: str, group: str) -> list[ReceivedMessage]:
    consumer = Consumer(nameserver=nameserver, group=f"gms-dlq-{os.getpid()}-{uuid.uuid4().hex[:6]}",
                        subscription={dlq_topic(group): "*"}, mode="broadcasting", start_from="first",
                        auto_commit=False, security=client_security())
    letters: list[ReceivedMessage] = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < READ_IDLE_S:
            got = consumer.poll(timeout_ms=200)
            if got:
                letters += got
                last = time.monotonic()
    finally:
        consumer.close()
    return letters


def _letter_dict(letter: ReceivedMessage) -> dict[str, object]:
    return {"msg_id": letter.msg_id, "topic": origin_topic(letter),
            "original_msg_id": letter.properties.get(ORIGIN_MSG_ID_PROPERTY), "attempts": letter.reconsume_times,
            "reason": letter.properties.get(DLQ_REASON_PROPERTY, ""), "dead_since_ms": letter.store_timestamp_ms,
            "tag": letter.tag, "keys": list(letter.keys), "properties": dict(letter.properties),
            "body": body_text(letter.body)}


@dlq.command("list")
@click.argument("group")
@nameserver_option
@json_option
def dlq_list(group: str, nameserver: str, as_json: bool) -> None:
    """The dead letters of GROUP: where each came from, how often it failed and why."""
    try:
        letters = _dead_letters(nameserver, group)
    except TopicNotFoundError:
        letters = []  # the group never failed a message too often
    if as_json:
        print_json([_letter_dict(m) for m in letters])
        return
    show(table(f"dead letters of {group} ({len(letters)})",
               ["msg id", "topic", "attempts", "reason", "dead since", "body"],
               [(m.msg_id, origin_topic(m), m.reconsume_times, m.properties.get(DLQ_REASON_PROPERTY, ""),
                 time_text(m.store_timestamp_ms), body_text(m.body)[:BODY_PREVIEW_CHARS]) for m in letters]))


@dlq.command("show")
@click.argument("group")
@click.argument("msg_id")
@nameserver_option
@json_option
def dlq_show(group: str, msg_id: str, nameserver: str, as_json: bool) -> None:
    """One dead letter of GROUP, whole: where it came from, attempts, reason, tag, keys, properties
    and body."""
    with open_admin(nameserver) as admin:
        letter = _own_letter(admin.view_message(msg_id), group, msg_id)
    found = _letter_dict(letter)
    if as_json:
        print_json(found)
        return
    rows = [(k, ", ".join(f"{p}={v}" for p, v in letter.properties.items()) if k == "properties" else v)
            for k, v in found.items() if k != "body"]
    show(table(None, ["field", "value"], rows))
    click.echo(body_text(letter.body))


@dlq.command("resend")
@click.argument("group")
@click.argument("msg_ids", nargs=-1, required=True)
@nameserver_option
def dlq_resend(group: str, msg_ids: tuple[str, ...], nameserver: str) -> None:
    """Give dead letters of GROUP back to the group (through its retry topic, at once, their
    attempts counted from 0 again). The dead letters stay listed."""
    with open_admin(nameserver) as admin:
        letters = [_own_letter(admin.view_message(msg_id), group, msg_id) for msg_id in msg_ids]
    with Producer(nameserver=nameserver, security=client_security(), acks=-1) as producer:
        for letter in letters:
            properties = {k: v for k, v in letter.properties.items() if k != DLQ_REASON_PROPERTY}
            properties.setdefault(ORIGIN_TOPIC_PROPERTY, origin_topic(letter))
            sent = producer.send(retry_topic(group), bytes(letter.body), tag=letter.tag, keys=letter.keys,
                                 properties=properties)
            click.echo(f"{letter.msg_id} -> {sent.msg_id} ({retry_topic(group)})")


def _own_letter(message: ReceivedMessage, group: str, msg_id: str) -> ReceivedMessage:
    if message.topic != dlq_topic(group):
        raise click.BadParameter(f"{msg_id} is a message of {message.topic}, not a dead letter of {group}",
                                 param_hint="MSG_ID")
    return message
