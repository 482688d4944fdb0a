"""``gms tx``: open transactions (half messages not committed or rolled back yet), and deciding
one by hand (docs/transactions.md)."""

from __future__ import annotations

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import print_json, show, table


@click.group("tx")
def tx() -> None:
    """List open transactions; commit or roll one back by hand."""


def _age_text(age_ms: int) -> str:
    seconds = age_ms // 1000
    if seconds < 60:
        return f"{age_ms / 1000:.1f}s"
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


@tx.command("list")
@nameserver_option
@json_option
def tx_list(nameserver: str, as_json: bool) -> None:
    """Open transactions, oldest first: one row per broker holding part of one."""
    with open_admin(nameserver) as admin:
        rows = admin.list_transactions()
    if as_json:
        print_json(rows)
        return
    show(table(f"open transactions ({len(rows)})",
               ["tx id", "producer group", "queues", "messages", "age", "checks", "state", "broker"],
               [(row["tx_id"], row["group"], ", ".join(f"{t}/{q}" for t, q, _ in row["queues"]), row["messages"],
                 _age_text(row["age_ms"]), row["checks"], row["state"], row["broker"]) for row in rows]))


def _end(nameserver: str, tx_id: str, commit: bool) -> None:
    with open_admin(nameserver) as admin:
        brokers = admin.end_transaction(tx_id, commit=commit)
    click.echo(f"transaction {tx_id} {'committed' if commit else 'rolled back'} on {', '.join(brokers)}")


@tx.command("commit")
@click.argument("tx_id")
@nameserver_option
def tx_commit(tx_id: str, nameserver: str) -> None:
    """Commit the open transaction TX_ID: its messages become visible."""
    _end(nameserver, tx_id, True)


@tx.command("rollback")
@click.argument("tx_id")
@nameserver_option
def tx_rollback(tx_id: str, nameserver: str) -> None:
    """Roll back the open transaction TX_ID: its messages are dropped."""
    _end(nameserver, tx_id, False)
