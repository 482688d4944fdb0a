"""One rule for times typed by people, shared by the CLI and the Spark options.

A time is epoch milliseconds (``1700000000000``) or ISO 8601 (``2026-11-23``,
``2026-11-23T15:04:05``, ``…Z``, ``…+01:00``). **A time without a zone is UTC**, everywhere:
a broker, a Spark cluster and an operator's laptop may sit in different zones, and the same
command must mean the same instant on each of them. Name a zone (``Z`` or ``+hh:mm``) to mean
anything else.
"""

from __future__ import annotations

from datetime import UTC, datetime


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds of ``text``; ``ValueError`` says what is accepted."""
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as err:
        raise ValueError(
            f"{text!r} is neither epoch milliseconds nor an ISO-8601 time such as 2026-11-23T15:04:05Z "
            "(a time without a zone is UTC)"
        ) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)
