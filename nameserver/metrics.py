"""The nameserver's Prometheus metrics (docs/monitoring.md lists them).

Counted as things happen, once per request or etcd call: requests per code and status, route
lookups by result, etcd calls per operation (their time and errors, from the etcd client's
observer), the queue leader changes this nameserver wrote as controller, its transactions and
the topics they wrote. Everything else is read when Prometheus scrapes
(:class:`_NameserverCollector`): brokers and topics in the cluster view, its health, the
controller's epoch and whether it is this nameserver, the up time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gms.monitoring.requests import LATENCY_BUCKETS_S, RequestMetrics

if TYPE_CHECKING:
    from gms.nameserver.server import NameServer


class NameserverMetrics:
    def __init__(self, server: NameServer) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestMetrics(self.registry, "gms_nameserver")
        lookups = Counter("gms_nameserver_route_lookups", "GET_ROUTE requests, by whether the topic exists",
                          ["result"], registry=self.registry)
        self.route_found = lookups.labels("found")
        self.route_not_found = lookups.labels("not_found")
        self.failovers = Counter("gms_nameserver_failovers", "Queue leader changes this nameserver wrote as the"
                                 " controller", registry=self.registry)
        self._controller_txns = Counter("gms_nameserver_controller_transactions", "Fenced etcd transactions this"
                                        " nameserver sent as the controller (each writes up to 127 topics)",
                                        registry=self.registry)
        self._controller_topics = Counter("gms_nameserver_controller_topic_writes", "Topics this nameserver"
                                          " wrote as the controller (leaders or ISRs changed)", registry=self.registry)
        self._etcd_seconds = Histogram("gms_nameserver_etcd_request_seconds", "Time of an etcd call, per operation",
                                       ["op"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self._etcd_errors = Counter("gms_nameserver_etcd_errors", "etcd calls that failed, per operation", ["op"],
                                    registry=self.registry)
        self._etcd_children: dict[str, tuple[Histogram, Counter]] = {}
        self.registry.register(_NameserverCollector(server))

    def controller_txn(self, topics: int) -> None:
        """The controller's ``on_txn``: one transaction sent, ``topics`` written by it."""
        self._controller_txns.inc()
        self._controller_topics.inc(topics)

    def etcd_call(self, op: str, seconds: float, error: Exception | None) -> None:
        """The etcd client's observer (:data:`gms.cluster.etcd_client.EtcdObserver`)."""
        children = self._etcd_children.get(op)
        if children is None:
            children = self._etcd_children[op] = (self._etcd_seconds.labels(op), self._etcd_errors.labels(op))
        children[0].observe(seconds)
        if error is not None:
            children[1].inc()


class _NameserverCollector(Collector):
    """Gauges read from the nameserver's cluster view and controller at scrape time (the
    monitoring endpoint serves only while the nameserver is started)."""

    def __init__(self, server: NameServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        view = server.view
        controller = server.controller_status()
        gauges = (
            ("gms_nameserver_up_seconds", "Seconds since the nameserver started serving",
             time.monotonic() - server.started_monotonic),
            ("gms_nameserver_brokers", "Brokers registered (live leases) in the cluster view", len(view.brokers())),
            ("gms_nameserver_topics", "Topics in the cluster view", len(view.topics())),
            ("gms_nameserver_view_healthy", "1 while the cluster view follows etcd, 0 while etcd is unreachable"
             " (routes are then served from the cache)", view.healthy),
            ("gms_nameserver_controller_epoch", "Epoch of the acting controller as this nameserver last saw it"
             " (0: none known)", controller.epoch),
            ("gms_nameserver_is_controller", "1 if this nameserver is the acting controller", controller.is_self),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
