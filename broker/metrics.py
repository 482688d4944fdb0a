"""The broker's Prometheus metrics (docs/monitoring.md lists them).

Counted on the data path, once per request: messages and bytes stored per topic (from the
append's per-queue counts; per queue too with ``metrics_per_queue``) and served (pulls and
pops), send-to-ack latency by acks mode, the subscription each group last read a topic with.
The store and the replica manager time their own work (flushes, retention, high-watermark
advances). Everything else is read when Prometheus scrapes (:class:`_BrokerCollector`): the
store, connections, parked long polls, scheduled messages, pop consumption, replication state,
group rebalances and consumer-group lag of the queues this broker leads.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gms.broker.ha.partition import Role
from gms.broker.store import AppendResult
from gms.monitoring.loop import LoopHistograms, counter_family
from gms.monitoring.requests import LATENCY_BUCKETS_S, RequestMetrics
from gms.record.layout import OFF_STORE_TS
from gms.store_errors import StoreError

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer


class BrokerMetrics:
    """What the data path counts, on the event loop (:mod:`gms.monitoring.loop`: no lock, no
    label lookup per request), and the collector that reads the rest at scrape time."""

    def __init__(self, broker: BrokerServer, *, per_queue: bool = False) -> None:
        """``per_queue``: label the in/out counters with the queue too (more series)."""
        self.registry = CollectorRegistry()
        self.requests = RequestMetrics(self.registry, "gms_broker")
        self.per_queue = per_queue
        # (topic, queue or "" / "pop") -> [messages, bytes], stored by sends and served to consumers
        self.stored_totals: dict[tuple[str, str], list[int]] = {}
        self.served_totals: dict[tuple[str, str], list[int]] = {}
        self.send_ack = LoopHistograms("gms_broker_send_ack_seconds", "From a send's dispatch to its"
                                       " acknowledgement (stored; flushed in sync mode; replicated with acks=-1)",
                                       ["acks"], LATENCY_BUCKETS_S)
        self._acked = {acks: self.send_ack.child(str(acks)) for acks in (0, 1, -1)}
        self.hw_latency: LoopHistograms | None = None  # cluster mode: the replica manager's
        self.waiting_bytes = 0  # bytes of sends stored and waiting for their flush or replicas
        # (group, topic) -> tag hashes it last pulled or popped with (None: every tag)
        self.subscriptions: dict[tuple[str, str], frozenset[int] | None] = {}
        for collector in broker.store.metric_collectors():
            self.registry.register(collector)
        self.registry.register(_BrokerCollector(broker, self))

    def _add(self, totals: dict[tuple[str, str], list[int]],
             rows: Iterable[tuple[tuple[str, int | None], int, int]]) -> None:
        """Count ``((topic, queue_id), messages, bytes)`` rows (one loop: a send of many topics'
        batches names hundreds of queues). ``queue_id`` None: a pop's answer, which may mix
        queues (label ``queue="pop"``)."""
        per_queue = self.per_queue
        for (topic, queue_id), count, size in rows:
            key = (topic, ("pop" if queue_id is None else str(queue_id)) if per_queue else "")
            pair = totals.get(key)
            if pair is None:
                pair = totals[key] = [0, 0]
            pair[0] += count
            pair[1] += size

    def stored(self, result: AppendResult) -> None:
        """A send's batch was stored."""
        self._add(self.stored_totals, zip(result.touched_queues, result.queue_counts, result.queue_bytes, strict=True))

    def served(self, topic: str, queue_id: int | None, count: int, size: int) -> None:
        """A pull (of ``queue_id``) or a pop (None: it may mix queues) answered ``count`` records."""
        if count:
            self._add(self.served_totals, (((topic, queue_id), count, size),))

    def acked(self, acks: int, seconds: float) -> None:
        """A send was acknowledged ``seconds`` after its dispatch."""
        self._acked[acks].observe(seconds)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class _BrokerCollector(Collector):
    """Gauges read from the broker's state at scrape time."""

    def __init__(self, broker: BrokerServer, metrics: BrokerMetrics) -> None:
        self.broker = broker
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._traffic()
        broker = self.broker
        store = broker.store
        stats = store.stats()
        yield _gauge("gms_broker_up_seconds", "Seconds since the broker started serving",
                     time.monotonic() - broker.started_monotonic)
        yield _gauge("gms_broker_connections", "Open client connections", broker.rpc.connection_count)
        yield _gauge("gms_broker_long_polls_parked", "Pulls and pops waiting for messages", len(broker.waiters))
        yield _gauge("gms_broker_disk_used_bytes", "What the store's directory takes on disk (du)",
                     stats.disk_used_bytes)
        yield _gauge("gms_broker_commitlog_bytes", "Commitlog bytes kept (written end - first kept)",
                     stats.max_offset - stats.min_offset)
        yield _gauge("gms_broker_unflushed_bytes", "Commitlog bytes written but not yet fsynced",
                     max(0, stats.max_offset - store.flushed_offset))
        health = GaugeMetricFamily("gms_broker_store_health", "1 for the store's state: writable, read_only"
                                   " (a flush failed) or disk_full", labels=["state"])
        for state in ("writable", "read_only", "disk_full"):
            health.add_metric([state], 1 if store.health.value == state else 0)
        yield health
        halves = broker.transactions.pending_halves
        yield _gauge("gms_broker_scheduled_messages_pending", "Scheduled messages not yet delivered",
                     broker.timers.pending_count - halves)
        yield _gauge("gms_broker_transactions_open", "Transactions with half messages stored here and not"
                     " committed or rolled back yet", broker.transactions.open_count)
        yield _gauge("gms_broker_transaction_halves_pending", "Half messages of those transactions", halves)
        yield _gauge("gms_broker_pop_messages_in_flight", "Popped messages not yet acknowledged",
                     broker.pop.in_flight())
        yield _gauge("gms_broker_sends_waiting_bytes", "Bytes of sends stored and waiting for their flush or"
                     " replicas before the acknowledgement", self.metrics.waiting_bytes)
        yield _gauge("gms_broker_commitlog_resident_ratio", "Fraction of the active commitlog file's written"
                     " pages in the page cache", store.resident_fraction())
        yield from self._groups()
        yield from self._replication()
        yield from self._group_lag()

    def _traffic(self) -> Iterator[Metric]:
        metrics = self.metrics
        labels = ["topic", "queue"] if metrics.per_queue else ["topic"]

        def series(totals: dict[tuple[str, str], list[int]], which: int) -> list[tuple[tuple[str, ...], float]]:
            return [((topic, queue) if metrics.per_queue else (topic,), pair[which])
                    for (topic, queue), pair in list(totals.items())]
        yield counter_family("gms_broker_messages_in", "Messages stored by sends", labels,
                             series(metrics.stored_totals, 0))
        yield counter_family("gms_broker_bytes_in", "Record bytes stored by sends", labels,
                             series(metrics.stored_totals, 1))
        yield counter_family("gms_broker_messages_out", "Messages served to consumers (pulls and pops)", labels,
                             series(metrics.served_totals, 0))
        yield counter_family("gms_broker_bytes_out", "Record bytes served to consumers", labels,
                             series(metrics.served_totals, 1))
        yield metrics.send_ack.family()
        if metrics.hw_latency is not None:
            yield metrics.hw_latency.family()

    def _groups(self) -> Iterator[Metric]:
        coordinator = self.broker.groups
        members = GaugeMetricFamily("gms_broker_group_members", "Members of each consumer group this broker"
                                    " coordinates", labels=["group"])
        for name in coordinator.group_names():
            group = coordinator.group(name)
            members.add_metric([name], len(group.members) if group is not None else 0)
        yield members
        rebalances = CounterMetricFamily("gms_broker_group_rebalances", "Membership changes (joins, leaves,"
                                         " expiries) of the groups coordinated here", labels=["group"])
        for name, count in list(coordinator.rebalances.items()):
            rebalances.add_metric([name], count)
        yield rebalances

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
        behind_s = GaugeMetricFamily("gms_broker_follower_lag_seconds", "Since a follower last had everything the"
                                     " leader had, per queue led here", labels=["topic", "queue", "follower"])
        now_s = time.monotonic()
        under = 0
        for key, partition in list(replicas.partitions.items()):
            if partition.role is not Role.LEADER:
                continue
            labels = [key[0], str(key[1])]
            isr.add_metric(labels, len(partition.isr))
            under += len(partition.isr) < len(partition.replicas)
            end = self.broker.store.max_offset(*key)
            for follower, progress in partition.followers.items():
                if progress.known:  # not before its first fetch of this term (or since it left the ISR)
                    lag.add_metric([*labels, follower], max(0, end - progress.leo))
                    behind_s.add_metric([*labels, follower], max(0.0, now_s - progress.last_caught_up_s))
        yield isr
        yield lag
        yield behind_s
        yield _gauge("gms_broker_under_replicated_queues", "Queues led here with fewer in-sync replicas than"
                     " replicas", under)

    def _group_lag(self) -> Iterator[Metric]:
        """Per group and queue led here: the messages after the committed offset that the
        group's subscription receives (its tags, as it last pulled or popped; every tag until
        then) and how old the oldest of them is (its store time; 0 without lag). Offline groups
        count too."""
        broker = self.broker
        messages = GaugeMetricFamily("gms_broker_group_lag_messages", "Messages a consumer group has yet to"
                                     " consume (of the tags it subscribes to), per queue led here",
                                     labels=["group", "topic", "queue"])
        age = GaugeMetricFamily("gms_broker_group_lag_seconds", "Age of the oldest message a consumer group has not"
                                " consumed, per queue led here", labels=["group", "topic", "queue"])
        now_ms = time.time() * 1000
        led = set(self._led())
        subscriptions = self.metrics.subscriptions
        for group in broker.offsets.groups():
            for topic, queues in broker.offsets.group_offsets(group).items():
                tag_hashes = subscriptions.get((group, topic))
                for queue_id, committed in queues.items():
                    if (topic, queue_id) not in led:
                        continue
                    try:
                        behind, first = broker.store.backlog(topic, queue_id, committed, tag_hashes,
                                                             broker.read_limit((topic, queue_id)))
                    except StoreError:
                        continue
                    labels = [group, topic, str(queue_id)]
                    messages.add_metric(labels, behind)
                    age.add_metric(labels, 0.0 if first is None else self._age_s(topic, queue_id, first, now_ms))
        yield messages
        yield age

    def _age_s(self, topic: str, queue_id: int, offset: int, now_ms: float) -> float:
        try:
            record = self.broker.store.read_entry(topic, queue_id, offset)
        except (StoreError, ValueError):
            return 0.0
        stored_ms = int.from_bytes(record[OFF_STORE_TS: OFF_STORE_TS + 8], "big", signed=True)
        return max(0.0, (now_ms - stored_ms) / 1000)
