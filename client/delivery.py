"""When a scheduled message is delivered: an absolute time, a delay, or one of RocketMQ 4's
18 delay levels (docs/scheduled-messages.md)."""

from __future__ import annotations

import datetime
import time

# RocketMQ 4's messageDelayLevel: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".
DELAY_LEVELS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
DELAY_MAX_MS = 7 * 24 * 3600 * 1000  # the brokers' default maximum (docs/scheduled-messages.md)


def deliver_at_ms(deliver_at: datetime.datetime | int | float | None = None, delay_ms: int | None = None,
                  delay_level: int | None = None, *, now_ms: int | None = None) -> int | None:
    """The delivery time in epoch ms, or None to deliver at once. ``deliver_at`` is a datetime
    (naive means local time) or epoch ms; ``delay_level`` is 1..18. Give at most one."""
    given = [x for x in (deliver_at, delay_ms, delay_level) if x is not None]
    if len(given) > 1:
        raise ValueError("give one of deliver_at, delay_ms or delay_level")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if deliver_at is not None:
        at = int(deliver_at.timestamp() * 1000) if isinstance(deliver_at, datetime.datetime) else int(deliver_at)
    elif delay_ms is not None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, not {delay_ms}")
        at = now + int(delay_ms)
    elif delay_level is not None:
        if not 1 <= delay_level <= len(DELAY_LEVELS_S):
            raise ValueError(f"delay_level must be 1..{len(DELAY_LEVELS_S)}, not {delay_level}")
        at = now + DELAY_LEVELS_S[delay_level - 1] * 1000
    else:
        return None
    if at - now > DELAY_MAX_MS:
        raise ValueError(f"a message can be scheduled at most {DELAY_MAX_MS // 86_400_000} days ahead")
    return at if at > now else None
