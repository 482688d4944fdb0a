"""Everything a command prints: rich tables for people, JSON for scripts, message bodies that
are safe to show, and the one place that turns expected failures into short errors."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gms.client.display import body_text
from gms.client.routing import NameserversUnavailableError
from gms.client.structs import ReceivedMessage
from gms.errors import ForbiddenError, GmsError, ServiceUnavailableError

# A table piped to a file or captured by a test gets this width instead of rich's 80 columns.
NON_TERMINAL_WIDTH = 160


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else NON_TERMINAL_WIDTH,
                   highlight=False, soft_wrap=False)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    out = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        numeric = name in NUMERIC_COLUMNS
        out.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        out.add_row(*("-" if v is None else str(v) for v in row))
    return out


NUMERIC_COLUMNS = frozenset({
    "queue", "queues", "min", "max", "messages", "committed", "lag", "epoch", "topics",
    "offset", "new", "disk used", "uptime",
})


def show(*renderables: Any) -> None:
    out = console()
    for item in renderables:
        out.print(item)


def size_text(size_bytes: int | None) -> str:
    if size_bytes is None:
        return "-"
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def time_text(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def message_line(msg: ReceivedMessage) -> str:
    """One message as one line of text: where it is, its tag and keys, then the body."""
    parts = [f"{msg.topic}/{msg.queue_id}@{msg.queue_offset}"]
    if msg.tag:
        parts.append(f"tag={msg.tag}")
    if msg.keys:
        parts.append("keys=" + ",".join(msg.keys))
    parts.append(body_text(msg.body))
    return "  ".join(parts)


# What to do next, after errors whose message says what went wrong but not what helps.
_HINTS: tuple[tuple[type[GmsError], str], ...] = (
    (ForbiddenError, "A super user grants it with `gms acl add` (docs/security.md)."),
    (ServiceUnavailableError, "Is the broker running? `gms cluster` lists the live ones."),
)


def error_text(err: BaseException) -> str:
    """An error as the CLI prints it, the one formatter for all of them: what is wrong and what to
    do, in words (no class names)."""
    if isinstance(err, NameserversUnavailableError):
        return (f"no nameserver at {','.join(err.nameservers)} — start one with `gms standalone`, or point"
                " --nameserver / GMS_NAMESERVER at a running one\n  " + "\n  ".join(err.failures))
    text = str(err) or (type(err).__doc__ or type(err).__name__).strip().splitlines()[0]
    hint = next((hint for kind, hint in _HINTS if isinstance(err, kind)), "")
    return f"{text}\n{hint}" if hint else text
