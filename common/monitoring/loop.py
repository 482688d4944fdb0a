"""Metrics kept by one thread (a server's event loop) and turned into Prometheus families only
when scraped (on the same loop). No lock and no label lookup per observation: a histogram
observation is a bisect and two additions, a counter a dict lookup and an addition -- a tenth of
what ``prometheus_client``'s thread-safe metric children cost, which on a single small send is
several percent of the request (bench_metrics.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily


class LoopHistogram:
    """Counts per bucket (``le`` bounds, the last for +Inf) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class LoopHistograms:
    """One :class:`LoopHistogram` per label values, created on first use."""

    def __init__(self, name: str, documentation: str, labels: list[str], bounds: tuple[float, ...]) -> None:
        self.name, self.documentation, self.labels, self.bounds = name, documentation, labels, bounds
        self.series: dict[tuple[str, ...], LoopHistogram] = {}

    def child(self, *values: str) -> LoopHistogram:
        histogram = self.series.get(values)
        if histogram is None:
            histogram = self.series[values] = LoopHistogram(self.bounds)
        return histogram

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, histogram in list(self.series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, float("inf")), histogram.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            family.add_metric(list(values), buckets, histogram.total)
        return family


def counter_family(name: str, documentation: str, labels: list[str],
                   series: Iterable[tuple[tuple[str, ...], float]]) -> CounterMetricFamily:
    """``name`` (without ``_total``) with one sample per (label values, value)."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, value in series:
        family.add_metric(list(values), value)
    return family
