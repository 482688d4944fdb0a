"""Broker settings: defaults, a TOML file, then command-line overrides.

The TOML file holds a ``[broker]`` table with the fields of :class:`BrokerConfig`, a
``[store]`` table with the fields of the store's ``StoreConfig`` and a ``[security]`` table with
those of :class:`gms.security.config.SecurityConfig`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gms.address import split_address
from gms.broker.store.layout import read_layout
from gms.broker.store.paths import StorePaths
from gms.broker.store_config import StoreConfig
from gms.net.busy_poll import SERVER_WINDOW_US
from gms.net.server import (
    CONNECTIONS_MAX,
    HEADER_TIMEOUT_MS,
    IDLE_TIMEOUT_MS,
    UNFINISHED_FRAMES_BYTES_MAX,
    ServerConfig,
)
from gms.security.config import SecurityConfig
from gms.store_errors import StoreCorrupt

DEFAULT_PORT = 10911


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    # The address clients are told to use (message ids, routes); derived from
    # ``listen`` when empty.
    advertised_address: str = ""
    broker_name: str = ""
    # host:port of /metrics, /healthz and /readyz (Prometheus; docs/monitoring.md); empty: none.
    metrics_listen: str = ""
    # host:port of the RocketMQ 5 gRPC API (docs/rocketmq-compat.md; the `rocketmq` extra); empty: none.
    rocketmq_listen: str = ""
    # host:port of the Kafka API (docs/kafka-compat.md), and the host:port Kafka clients are told
    # (default: the advertised address's host with the bound port); empty: none.
    kafka_listen: str = ""
    kafka_advertised: str = ""
    metrics_per_queue: bool = False  # label messages/bytes in/out by queue too (more series)
    cluster: str = "DefaultCluster"
    store_dir: Path = Path("gms-data/broker")
    nameserver: str = ""
    # How long a starting broker keeps trying to reach a nameserver before giving up.
    register_timeout_s: float = 30.0
    default_queue_count: int = 8
    auto_create_topics: bool = False
    long_poll_max_ms: int = 15_000
    member_expiry_ms: int = 30_000
    offset_persist_interval_ms: int = 1_000
    send_timeout_ms: int = 5_000
    # Replication (cluster mode). The lease TTL bounds how fast a dead broker's queues fail over.
    lease_ttl_s: int = 10
    replica_lag_time_max_ms: int = 10_000  # a follower not caught up for this long leaves the ISR
    replica_fetch_wait_ms: int = 500  # a caught-up follower's fetch parks this long at the leader
    replica_fetch_bytes_max: int = 8 << 20
    # Kafka's replica.high.watermark.checkpoint.interval.ms: each checkpoint writes every queue's HW
    hw_checkpoint_interval_ms: int = 5_000
    # Followers flush fetched records before acknowledging them (their next fetch): acks=-1 with
    # flush=sync then means "on disk on every ISR member" (docs/replication.md).
    replica_fsync_before_ack: bool = False
    # Client connections (gms.net.server explains the defaults).
    connections_max: int = CONNECTIONS_MAX
    unfinished_frames_bytes_max: int = UNFINISHED_FRAMES_BYTES_MAX  # all connections together
    idle_timeout_ms: int = IDLE_TIMEOUT_MS
    header_timeout_ms: int = HEADER_TIMEOUT_MS
    # The event loop polls this long after each read or write before it sleeps (gms.net.busy_poll).
    # None: SERVER_WINDOW_US with async flush, 0 with sync flush -- a send then waits ~ms for its
    # fsync anyway, and a polling loop keeps the GIL from the flush thread.
    busy_poll_us: int | None = None
    # Transactions (docs/transactions.md; RocketMQ's defaults): the first check-back of an open
    # transaction this long after its first half message, then every interval, at most this many
    # checks before it is rolled back.
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 30_000
    transaction_check_max: int = 15
    store: StoreConfig = field(default_factory=StoreConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        if self.busy_poll_us is not None and self.busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be >= 0, not {self.busy_poll_us}")
        if self.security.authentication and not self.nameserver:
            raise ValueError("authentication needs a cluster: users live in etcd; start the broker with"
                             " --nameserver (`gms standalone --secure` runs one)")
        if self.security.authentication and self.rocketmq_listen:
            raise ValueError("the RocketMQ API does not authenticate its clients yet: it cannot be served with"
                             " authentication on (drop --rocketmq-listen or the [security] authentication)")
        if self.kafka_advertised:
            split_address(self.kafka_advertised, "kafka advertised address")

    @property
    def host_port(self) -> tuple[str, int]:
        return split_address(self.listen, "listen address", port_zero_ok=True)

    @property
    def rocketmq_host_port(self) -> tuple[str, int]:
        return split_address(self.rocketmq_listen, "rocketmq listen address", port_zero_ok=True)

    @property
    def kafka_host_port(self) -> tuple[str, int]:
        return split_address(self.kafka_listen, "kafka listen address", port_zero_ok=True)

    @property
    def metrics_host_port(self) -> tuple[str, int]:
        return split_address(self.metrics_listen, "metrics listen address", port_zero_ok=True)

    @property
    def server_config(self) -> ServerConfig:
        """The RPC server's limits."""
        return ServerConfig(connections_max=self.connections_max,
                            unfinished_frames_bytes_max=self.unfinished_frames_bytes_max,
                            idle_timeout_ms=self.idle_timeout_ms, header_timeout_ms=self.header_timeout_ms,
                            busy_poll_us=self.effective_busy_poll_us)

    @property
    def effective_busy_poll_us(self) -> int:
        if self.busy_poll_us is not None:
            return self.busy_poll_us
        return SERVER_WINDOW_US if self.store.flush_mode == "async" else 0


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)


def load_config(path: Path | None, overrides: dict[str, Any], store_overrides: dict[str, Any],
                security_overrides: dict[str, Any] | None = None) -> BrokerConfig:
    """Defaults < TOML file < overrides (``None`` values in overrides are ignored). An existing
    store's geometry (commitlog file size, consumeQueue entries per file) is the default for
    what is not given: only a value given that contradicts it is refused (when the store opens)."""
    broker_values: dict[str, Any] = {}
    store_values: dict[str, Any] = {}
    security_values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        extra = sorted(set(data) - {"broker", "store", "security"})
        if extra:
            raise ValueError(f"{path}: unknown table(s) {', '.join(extra)}; use [broker], [store] and [security]")
        broker_values.update(data.get("broker", {}))
        store_values.update(data.get("store", {}))
        security_values.update(data.get("security", {}))
    broker_values.update({k: v for k, v in overrides.items() if v is not None})
    store_values.update({k: v for k, v in store_overrides.items() if v is not None})
    security_values.update({k: v for k, v in (security_overrides or {}).items() if v is not None})
    if "store_dir" in broker_values:
        broker_values["store_dir"] = Path(broker_values["store_dir"])
    _default_to_stored_geometry(broker_values.get("store_dir", BrokerConfig.store_dir), store_values)
    store = _build(StoreConfig, store_values, f"{path or 'options'} [store]")
    security = _build(SecurityConfig, security_values, f"{path or 'options'} [security]")
    return _build(BrokerConfig, {**broker_values, "store": store, "security": security},
                  f"{path or 'options'} [broker]")


def _default_to_stored_geometry(store_dir: Path, store_values: dict[str, Any]) -> None:
    """Fill the geometry settings not given from the store's ``layout.json``, if it has one (a
    damaged one is reported when the store opens)."""
    try:
        recorded = read_layout(StorePaths.of_broker(store_dir).layout)
    except (StoreCorrupt, OSError):
        return
    for name, value in (recorded or {}).items():
        if value is not None:
            store_values.setdefault(name, value)
