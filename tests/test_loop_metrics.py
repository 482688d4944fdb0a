"""The event loop's lock-free histograms expose exactly what prometheus_client's own would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.registry import Collector

from gms.monitoring.loop import LoopHistograms
from gms.monitoring.requests import LATENCY_BUCKETS_S

OBSERVED = [0.00005, 0.0001, 0.0001001, 0.003, 0.003, 0.7, 12.0, 31.0, 99.0]


class _Families(Collector):
    def __init__(self, histograms: LoopHistograms) -> None:
        self.histograms = histograms

    def collect(self):
        yield self.histograms.family()


def test_loop_histogram_exposition_matches_prometheus_client():
    reference_registry, loop_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("t_seconds", "doc", ["code"], buckets=LATENCY_BUCKETS_S, registry=reference_registry)
    loop = LoopHistograms("t_seconds", "doc", ["code"], LATENCY_BUCKETS_S)
    loop_registry.register(_Families(loop))
    for i, value in enumerate(OBSERVED):
        code = "SEND" if i % 3 else "PULL"
        reference.labels(code).observe(value)
        loop.child(code).observe(value)
    assert generate_latest(loop_registry) == generate_latest(reference_registry)
