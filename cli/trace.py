"""``gms msg trace ID``: a message's life as its traced producer and consumers recorded it
(docs/traces.md)."""

from __future__ import annotations

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import print_json, show, table, time_text
from gms.client.trace_format import ACK, DEAD_LETTER, DELIVER, RETRY, SEND, STORE, TRACE_TOPIC, TraceEvent
from gms.msgid import decode_msg_id


@click.command(name="trace")
@click.argument("msg_id")
@click.option("--trace-topic", default=TRACE_TOPIC, show_default=True, help="The topic the clients traced to.")
@nameserver_option
@json_option
def trace_message(msg_id: str, trace_topic: str, nameserver: str, as_json: bool) -> None:
    """Show the life of the message MSG_ID as a timeline: who sent it when, which broker stored
    it, which group and client consumed it, retries and dead letter.

    Only clients made with trace=True record it. Exits with 1 when nothing was traced."""
    try:
        decode_msg_id(msg_id)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="MSG_ID") from err
    with open_admin(nameserver) as admin:
        events = admin.trace(msg_id, trace_topic=trace_topic)
    if not events:
        raise click.ClickException(
            f"no trace of message {msg_id} in {trace_topic}: is tracing off for its producer and consumers? "
            "Enable it with trace=True (docs/traces.md)")
    if as_json:
        print_json([event.as_dict() for event in events])
        return
    show(table(f"trace of {msg_id}", ["time", "event", "who", "where", "details"],
               [(_time(e), e.event, _who(e), _where(e), _details(e)) for e in events]))


def _time(event: TraceEvent) -> str:
    return time_text(event.time_us // 1000)


def _who(event: TraceEvent) -> str:
    if event.event == SEND:
        return f"producer {event.client or event.host}"
    if event.event == STORE:
        return f"broker {event.broker}"
    return f"group {event.group}, consumer {event.client}"


def _where(event: TraceEvent) -> str:
    if event.queue_id is None:
        return event.topic
    offset = "" if event.queue_offset is None else f"@{event.queue_offset}"
    return f"{event.topic}/{event.queue_id}{offset}"


def _details(event: TraceEvent) -> str:
    d = event.details
    if event.event == SEND:
        parts = [f"tag={d['tag']}" if d.get("tag") else "", f"keys={d['keys']}" if d.get("keys") else "",
                 f"{d['size']} B" if d.get("size") is not None else "", _cost(event.cost_us),
                 str(d.get("status", ""))]
    elif event.event == STORE:
        parts = ["stored" if "store_time_ms" in d else "acknowledged to the producer"]
    elif event.event == DELIVER:
        parts = [f"attempt {event.attempt}"]
    elif event.event == ACK:
        parts = [f"consumed {_cost(event.cost_us)} after delivery"]
    elif event.event == RETRY:
        parts = [f"attempt {event.attempt} failed", f"again in {d.get('delay_ms')} ms",
                 f"via {d['to']}" if d.get("to") != event.topic else "held in its queue (FIFO)"]
    elif event.event == DEAD_LETTER:
        parts = [f"attempt {event.attempt} failed: {d.get('reason') or '-'}",
                 f"moved to {d.get('to')} as {d.get('copy_id')}"]
    else:
        parts = [str(dict(d))]
    return ", ".join(p for p in parts if p)


def _cost(cost_us: int | None) -> str:
    if cost_us is None:
        return ""
    return f"{cost_us} µs" if cost_us < 10_000 else f"{cost_us / 1000:.1f} ms"
