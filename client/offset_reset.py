"""Where a consumer group's offset reset moves each queue (``gms group reset-offsets``,
:meth:`gms.client.Admin.reset_offsets`), as Kafka's ``kafka-consumer-groups --reset-offsets``.

The rules are pure: :func:`new_offset` takes what the brokers answered (the committed offset, the
queue's readable range, the offset found for a time) and returns the target, clamped to the
range consumers can read. The Admin client asks the brokers and applies the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class ResetMode(StrEnum):
    EARLIEST = "earliest"  # the queue's first readable offset
    LATEST = "latest"  # the queue's end: only messages sent after the reset are consumed
    DATETIME = "datetime"  # the first message stored at or after a time
    SHIFT_BY = "shift-by"  # the committed offset moved by N (negative: consume again)
    OFFSET = "offset"  # this offset


@dataclass(frozen=True, slots=True)
class ResetSpec:
    """A reset target; ``value`` is epoch ms (DATETIME), the shift (SHIFT_BY) or the offset
    (OFFSET), unused otherwise. Build it with the class methods."""

    mode: ResetMode
    value: int = 0

    @classmethod
    def earliest(cls) -> ResetSpec:
        return cls(ResetMode.EARLIEST)

    @classmethod
    def latest(cls) -> ResetSpec:
        return cls(ResetMode.LATEST)

    @classmethod
    def to_datetime(cls, timestamp_ms: int) -> ResetSpec:
        return cls(ResetMode.DATETIME, timestamp_ms)

    @classmethod
    def shift_by(cls, delta: int) -> ResetSpec:
        return cls(ResetMode.SHIFT_BY, delta)

    @classmethod
    def to_offset(cls, offset: int) -> ResetSpec:
        return cls(ResetMode.OFFSET, offset)


class QueueReset(NamedTuple):
    """One queue of a reset plan (or, once executed, of what the broker stored)."""

    topic: str
    queue_id: int
    broker: str  # the queue's leader, which holds the group's committed offset
    committed: int | None  # the group's committed offset before the reset; None: none
    new_offset: int | None  # None: left alone (SHIFT_BY on a queue without a committed offset)
    min_offset: int
    max_offset: int  # the end consumers can read (the high watermark when replicated)


def new_offset(spec: ResetSpec, *, committed: int | None, min_offset: int, max_offset: int,
               offset_for_time: int | None = None) -> int | None:
    """The offset ``spec`` moves a queue to, clamped to [min_offset, max_offset].

    SHIFT_BY moves the committed offset; a queue the group never committed on has no position
    to shift (a new consumer would start where its own ``start_from`` says), so it is left
    alone and ``None`` is returned — Kafka's tool refuses the whole reset in that case.
    """
    if spec.mode is ResetMode.EARLIEST:
        target = min_offset
    elif spec.mode is ResetMode.LATEST:
        target = max_offset
    elif spec.mode is ResetMode.DATETIME:
        if offset_for_time is None:
            raise ValueError("a DATETIME reset needs the offset the broker found for the time")
        target = offset_for_time
    elif spec.mode is ResetMode.SHIFT_BY:
        if committed is None:
            return None
        target = committed + spec.value
    else:
        target = spec.value
    return min(max(target, min_offset), max_offset)
