"""Request metrics of an RPC server: how many requests of each code ended in each status, and
how long they took (from the frame's dispatch to its answer being queued). One observation per
request, whatever it carries: a batch of a thousand messages costs what a ping costs."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gms.monitoring.loop import LoopHistogram, LoopHistograms
from gms.protocol.codes import RequestCode, Status

# From tens of microseconds (a ping on loopback) to the long polls' seconds.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0, 30.0)


def _name(enum: type[RequestCode] | type[Status], value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


class RequestMetrics(Collector):
    """Observed on the server's event loop (:class:`gms.monitoring.loop.LoopHistograms`)."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        """``prefix``: ``gms_broker`` or ``gms_nameserver``."""
        self._latency = LoopHistograms(f"{prefix}_request_seconds", "Time from a request's dispatch to its answer",
                                       ["code", "status"], LATENCY_BUCKETS_S)
        self._children: dict[tuple[int, int], LoopHistogram] = {}
        registry.register(self)

    def observe(self, code: int, status: int, seconds: float) -> None:
        child = self._children.get((code, status))
        if child is None:
            child = self._children[code, status] = self._latency.child(_name(RequestCode, code), _name(Status, status))
        child.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        yield self._latency.family()
