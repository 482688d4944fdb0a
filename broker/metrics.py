"""The broker's Prometheus metrics (docs/monitoring.md lists them).

Counted on the data path, once per request: messages and bytes stored per topic (from the
append's per-queue counts) and served per topic (pulls and pops). Everything else is read when
Prometheus scrapes (:class:`_BrokerCollector`): the store, connections, parked long polls,
scheduled messages, pop consumption, replication state and consumer-group lag of the queues
this broker leads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gms.broker.ha.partition import Role
from gms.broker.store import AppendResult
from gms.monitoring.requests import RequestMetrics
from gms.record.layout import OFF_STORE_TS
from gms.store_errors import StoreError

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)


class BrokerMetrics:
    def __init__(self, broker: BrokerServer) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestMetrics(self.registry, "gms_broker")
        self._messages_in = Counter("gms_broker_messages_in", "Messages stored by sends, per topic", ["topic"],
                                    registry=self.registry)
        self._bytes_in = Counter("gms_broker_bytes_in", "Record bytes stored by sends, per topic", ["topic"],
                                 registry=self.registry)
        self._messages_out = Counter("gms_broker_messages_out", "Messages served to consumers (pulls and pops),"
                                     " per topic", ["topic"], registry=self.registry)
        self._bytes_out = Counter("gms_broker_bytes_out", "Record bytes served to consumers, per topic", ["topic"],
                                  registry=self.registry)
        self._children: dict[tuple[Counter, str], Counter] = {}
        self.registry.register(_BrokerCollector(broker))

    def _child(self, counter: Counter, topic: str) -> Counter:
        child = self._children.get((counter, topic))
        if child is None:
            child = self._children[counter, topic] = counter.labels(topic)
        return child

    def stored(self, result: AppendResult) -> None:
        """A send's batch was stored."""
        for (topic, _), count, size in zip(result.touched_queues, result.queue_counts, result.queue_bytes,
                                           strict=True):
            self._child(self._messages_in, topic).inc(count)
            self._child(self._bytes_in, topic).inc(size)

    def served(self, topic: str, count: int, size: int) -> None:
        """A pull or pop answered ``count`` records of ``topic`` (``size`` bytes)."""
        if count:
            self._child(self._messages_out, topic).inc(count)
            self._child(self._bytes_out, topic).inc(size)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class _BrokerCollector(Collector):
    """Gauges read from the broker's state at scrape time."""

    def __init__(self, broker: BrokerServer) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        store = broker.store
        stats = store.stats()
        yield _gauge("gms_broker_up_seconds", "Seconds since the broker started serving",
                     time.monotonic() - broker.started_monotonic)
        yield _gauge("gms_broker_connections", "Open client connections", broker.rpc.connection_count)
        yield _gauge("gms_broker_long_polls_parked", "Pulls and pops waiting for messages", len(broker.waiters))
        yield _gauge("gms_broker_disk_used_bytes", "Commitlog and consumeQueue files", stats.disk_used_bytes)
        yield _gauge("gms_broker_commitlog_bytes", "Commitlog bytes kept (written end - first kept)",
                     stats.max_offset - stats.min_offset)
        yield _gauge("gms_broker_unflushed_bytes", "Commitlog bytes written but not yet fsynced",
                     max(0, stats.max_offset - store.flushed_offset))
        health = GaugeMetricFamily("gms_broker_store_health", "1 for the store's state: writable, read_only"
                                   " (a flush failed) or disk_full", labels=["state"])
        for state in ("writable", "read_only", "disk_full"):
            health.add_metric([state], 1 if store.health.value == state else 0)
        yield health
        yield _gauge("gms_broker_scheduled_messages_pending", "Scheduled messages not yet delivered",
                     broker.timers.pending_count)
        yield _gauge("gms_broker_pop_messages_in_flight", "Popped messages not yet acknowledged",
                     broker.pop.in_flight())
        yield from self._replication()
        yield from self._group_lag()

    def _led(self) -> list[tuple[str, int]]:
        broker = self.broker
        return [(topic, q) for topic, count in broker.store.topics().items() for q in range(count)
                if broker.leads((topic, q))]

    def _replication(self) -> Iterator[Metric]:
        replicas = self.broker.replicas
        if replicas is None:
            return
        isr = GaugeMetricFamily("gms_broker_queue_isr_size", "In-sync replicas of each queue led here",
                                labels=["topic", "queue"])
        lag = GaugeMetricFamily("gms_broker_follower_lag_messages", "Messages a follower lacks, per queue led here",
                                labels=["topic", "queue", "follower"])
        under = 0
        for key, partition in list(replicas.partitions.items()):
            if partition.role is not Role.LEADER:
                continue
            labels = [key[0], str(key[1])]
            isr.add_metric(labels, len(partition.isr))
            under += len(partition.isr) < len(partition.replicas)
            end = self.broker.store.max_offset(*key)
            for follower, progress in partition.followers.items():
                lag.add_metric([*labels, follower], max(0, end - progress.leo))
        yield isr
        yield lag
        yield _gauge("gms_broker_under_replicated_queues", "Queues led here with fewer in-sync replicas than"
                     " replicas", under)

    def _group_lag(self) -> Iterator[Metric]:
        """Per group and queue led here: messages after the committed offset, and how old the
        oldest of them is (its store time; 0 without lag). Offline groups count too."""
        broker = self.broker
        messages = GaugeMetricFamily("gms_broker_group_lag_messages", "Messages after a consumer group's committed"
                                     " offset, per queue led here", labels=["group", "topic", "queue"])
        age = GaugeMetricFamily("gms_broker_group_lag_seconds", "Age of the oldest message a consumer group has not"
                                " consumed, per queue led here", labels=["group", "topic", "queue"])
        now_ms = time.time() * 1000
        led = set(self._led())
        for group in broker.offsets.groups():
            for topic, queues in broker.offsets.group_offsets(group).items():
                for queue_id, committed in queues.items():
                    if (topic, queue_id) not in led:
                        continue
                    try:
                        low, end = broker.readable((topic, queue_id))
                    except StoreError:
                        continue
                    behind = max(0, end - max(committed, low))
                    labels = [group, topic, str(queue_id)]
                    messages.add_metric(labels, behind)
                    age.add_metric(labels, self._age_s(topic, queue_id, max(committed, low), now_ms) if behind else 0)
        yield messages
        yield age

    def _age_s(self, topic: str, queue_id: int, offset: int, now_ms: float) -> float:
        try:
            record = self.broker.store.read_entry(topic, queue_id, offset)
        except (StoreError, ValueError):
            return 0.0
        stored_ms = int.from_bytes(record[OFF_STORE_TS: OFF_STORE_TS + 8], "big", signed=True)
        return max(0.0, (now_ms - stored_ms) / 1000)
