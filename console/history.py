"""The console's short memory: per-topic appended-message counts and per-group lag, sampled every
few seconds over the last minutes, so a chart has history the moment its page opens.

Pure: the sampler records what it read with the time it read it; pages ask for series. Rates
are computed here from consecutive counts (messages/s between two samples).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from itertools import pairwise
from typing import Any, NamedTuple


class Point(NamedTuple):
    t_s: float  # wall-clock seconds (what charts put on their x axis)
    value: int


class History:
    """Series per topic and per group, each the last ``window_s`` of samples. A topic or group
    missing from a sample (deleted) loses its series, so memory stays bounded by what exists."""

    def __init__(self, *, interval_s: float, window_s: float) -> None:
        if interval_s <= 0 or window_s < interval_s:
            raise ValueError(f"need 0 < interval_s <= window_s, got {interval_s} and {window_s}")
        self.interval_s = interval_s
        self.window_s = window_s
        self._points_max = math.ceil(window_s / interval_s) + 1  # +1: n points make n-1 rates
        self._topics: dict[str, deque[Point]] = {}
        self._groups: dict[str, deque[Point]] = {}

    def record(self, t_s: float, appended: Mapping[str, int | None], lag: Mapping[str, int]) -> None:
        """One sample: messages ever appended per topic (None: its brokers did not answer, no point
        this time) and total lag per group, read at ``t_s``."""
        _record(self._topics, self._points_max, t_s, appended)
        _record(self._groups, self._points_max, t_s, lag)

    def topic_rates(self, topic: str) -> dict[str, list[Any]]:
        """``{"t": [...], "rate": [...]}``: messages/s appended to ``topic`` between consecutive
        samples, at the later one's time; None where the count went down (the topic was
        recreated) or the clock did not move forward."""
        points = list(self._topics.get(topic, ()))
        rates = [_rate(a, b) for a, b in pairwise(points)]
        return {"t": [p.t_s for p in points[1:]], "rate": rates}

    def latest_rate(self, topic: str) -> float | None:
        """The rate between the last two samples of ``topic`` (None before two samples)."""
        points = self._topics.get(topic)
        return _rate(points[-2], points[-1]) if points is not None and len(points) > 1 else None

    def group_lag(self, group: str) -> dict[str, list[Any]]:
        """``{"t": [...], "lag": [...]}``: ``group``'s total lag at each sample."""
        points = list(self._groups.get(group, ()))
        return {"t": [p.t_s for p in points], "lag": [p.value for p in points]}


def _record(series: dict[str, deque[Point]], points_max: int, t_s: float, values: Mapping[str, int | None]) -> None:
    for gone in series.keys() - values.keys():
        del series[gone]
    for name, value in values.items():
        if value is not None:
            series.setdefault(name, deque(maxlen=points_max)).append(Point(t_s, value))


def _rate(before: Point, after: Point) -> float | None:
    dt_s = after.t_s - before.t_s
    if dt_s <= 0 or after.value < before.value:
        return None
    return (after.value - before.value) / dt_s
