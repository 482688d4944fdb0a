"""Cluster metadata values, their validation, queue placement and their JSON form in etcd.

Pure: no etcd here, so the rules and the codec are unit-testable and shared by the writer
(`metadata.py`) and the watch-fed cache (`cluster_view.py`). Values are JSON, not msgpack:
metadata is small and off the hot path, and operators read it with plain
``etcdctl get --prefix /gms/``. The layout is documented in docs/etcd-layout.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from gms.address import split_address
from gms.cluster.errors import ClusterError, NotEnoughBrokers
from gms.errors import BadRequestError, GmsError, InvalidTopicError
from gms.naming import TOPIC_NAME_BYTES_MAX, validate_topic_name
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING as MESSAGE_SIZE_BYTES_MAX_CEILING
from gms.store_errors import InvalidTopicName

LAYOUT_VERSION = 1  # "v" in every value; bump on an incompatible change
QUEUE_COUNT_MAX = 1024  # one txn value stays ~100 KiB, far below etcd's 1.5 MiB request cap
DEFAULT_QUEUE_COUNT = 8
REPLICAS_MAX = 16
DEFAULT_MESSAGE_SIZE_BYTES_MAX = 4 * 1024 * 1024  # RocketMQ's maxMessageSize default
DEFAULT_CLUSTER = "DefaultCluster"
# RocketMQ 5's topic message types: what a topic accepts from RocketMQ clients ("mixed": all four).
TOPIC_MESSAGE_TYPES = ("normal", "fifo", "delay", "transaction", "mixed")
DEFAULT_TOPIC_MESSAGE_TYPE = "mixed"
# Kafka's cleanup.policy values: delete old records (by retention), keep the latest per key, or both.
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
DEFAULT_CLEANUP_POLICY = "delete"
DEFAULT_MIN_COMPACTION_LAG_MS = 0
DEFAULT_DIRTY_RATIO = 0.5
DEFAULT_TOMBSTONE_RETENTION_MS = 86_400_000
DEFAULT_SEGMENT_ROLL_MESSAGES = 1000
DEFAULT_COMPACTION: dict[str, int | float] = {
    "min_compaction_lag_ms": DEFAULT_MIN_COMPACTION_LAG_MS, "dirty_ratio": DEFAULT_DIRTY_RATIO,
    "tombstone_retention_ms": DEFAULT_TOMBSTONE_RETENTION_MS, "segment_roll_messages": DEFAULT_SEGMENT_ROLL_MESSAGES}
SEGMENT_ROLL_MESSAGES_MAX = 1 << 24


def default_min_insync_replicas(replication_factor: int) -> int:
    """1 for an unreplicated topic, else 2: one broker may die without refusing acks=-1 sends."""
    return 1 if replication_factor == 1 else 2


def validate_name(kind: str, name: str, error: type[GmsError] = InvalidTopicError) -> str:
    """Topic, broker and cluster names follow the store's topic-name rule (gms.naming):
    1..127 characters of ``[A-Za-z0-9_.%-]``, so they never contain the key separator ``/``."""
    try:
        return validate_topic_name(name)
    except InvalidTopicName as err:
        raise error(
            f"{kind} name {name!r} must be 1..{TOPIC_NAME_BYTES_MAX} characters of"
            f" [A-Za-z0-9_.%-], not . or .. ({err})"
        ) from err


def validate_address(address: str) -> str:
    try:
        split_address(address, "broker address")
    except ValueError as err:
        raise BadRequestError(str(err)) from err
    return address


def validate_message_type(message_type: Any) -> str:
    if message_type not in TOPIC_MESSAGE_TYPES:
        raise InvalidTopicError(f"topic setting message_type must be one of {', '.join(TOPIC_MESSAGE_TYPES)},"
                                f" not {message_type!r}")
    return str(message_type)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: str
    address: str  # host:port clients connect to
    cluster: str = DEFAULT_CLUSTER
    capacity_bytes: int = 0  # store disk capacity; 0 = not reported
    # False while a broker that restarted after an unclean stop (it may have lost records it had
    # acknowledged but not flushed) has not caught up with its leaders: the controller keeps it
    # out of every ISR and elects it only when no other in-sync replica is alive (KIP-966).
    caught_up: bool = True
    # host:port of the broker's RocketMQ 5 gRPC API (docs/rocketmq-compat.md); "": not served.
    rocketmq: str = ""
    # host:port of the broker's Kafka API (docs/kafka-compat.md); "": not served.
    kafka: str = ""

    def __post_init__(self) -> None:
        validate_name("broker", self.broker_id, BadRequestError)
        validate_name("cluster", self.cluster, BadRequestError)
        validate_address(self.address)
        for endpoint in (self.rocketmq, self.kafka):
            if endpoint:
                validate_address(endpoint)

    def to_json(self) -> bytes:
        return _dumps({"v": LAYOUT_VERSION, **asdict(self)})

    @classmethod
    def from_json(cls, raw: bytes) -> BrokerInfo:
        d = _loads(raw)
        return cls(d["broker_id"], d["address"], d["cluster"], int(d["capacity_bytes"]),
                   bool(d.get("caught_up", True)), str(d.get("rocketmq", "")), str(d.get("kafka", "")))


def check_message_size_max(value: int | None) -> None:
    """Refuse a topic's ``message_size_bytes_max`` above MESSAGE_SIZE_BYTES_MAX_CEILING."""
    if value is not None and value > MESSAGE_SIZE_BYTES_MAX_CEILING:
        raise InvalidTopicError(
            f"topic setting message_size_bytes_max (--message-size-max) is {value} bytes, above the"
            f" {MESSAGE_SIZE_BYTES_MAX_CEILING} bytes ({MESSAGE_SIZE_BYTES_MAX_CEILING >> 20} MiB) a message can"
            " be: one travels whole in a request")


def check_compaction(policy: str | None, lag_ms: int | None, dirty_ratio: float | None,
                     tombstone_retention_ms: int | None, segment_roll_messages: int | None) -> None:
    """Refuse compaction settings a topic cannot have (None: unset)."""
    if policy is not None and policy not in CLEANUP_POLICIES:
        raise InvalidTopicError(f"topic setting cleanup_policy (--cleanup) is {policy!r}: give one of"
                                f" {', '.join(CLEANUP_POLICIES)}")
    for name, value in (("min_compaction_lag_ms", lag_ms), ("tombstone_retention_ms", tombstone_retention_ms)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise InvalidTopicError(f"topic setting {name} must be an integer >= 0 (milliseconds), got {value!r}")
    if dirty_ratio is not None and (isinstance(dirty_ratio, bool) or not isinstance(dirty_ratio, (int, float))
                                    or not 0 <= dirty_ratio <= 1):
        raise InvalidTopicError(f"topic setting dirty_ratio must be a number in [0, 1], got {dirty_ratio!r}")
    if segment_roll_messages is not None and (
            not isinstance(segment_roll_messages, int) or isinstance(segment_roll_messages, bool)
            or not 1 <= segment_roll_messages <= SEGMENT_ROLL_MESSAGES_MAX):
        raise InvalidTopicError(f"topic setting segment_roll_messages must be 1..{SEGMENT_ROLL_MESSAGES_MAX},"
                                f" got {segment_roll_messages!r}")


@dataclass(frozen=True, slots=True)
class TopicSettings:
    # Records older than this are no longer served (store time); None: the broker's own
    # retention (``gms-broker --retention-hours``, 72 h by default), as Kafka's topic configs
    # fall back to the broker's.
    retention_ms: int | None = None
    # The largest record the topic accepts, counted as stored (header, topic, tag, born host,
    # keys, properties and body). RocketMQ's maxMessageSize.
    message_size_bytes_max: int = DEFAULT_MESSAGE_SIZE_BYTES_MAX
    # acks=-1 sends need this many in-sync replicas. None only on input ("the default for the
    # replication factor"); a TopicMetadata always holds the resolved 1..replication_factor.
    min_insync_replicas: int | None = None
    # Elect an out-of-sync replica when no in-sync one is alive: available, but may lose
    # acknowledged messages. Off by default (Kafka's unclean.leader.election.enable).
    unclean_leader_election: bool = False
    # What the topic accepts from RocketMQ 5 clients (one of TOPIC_MESSAGE_TYPES): the RocketMQ
    # endpoint refuses sends of other types, as RocketMQ's brokers do. Topics without it are mixed.
    message_type: str = DEFAULT_TOPIC_MESSAGE_TYPE
    # Compaction (docs/storage-format.md "Compacted topics"): "compact" keeps the latest record per
    # key, "compact,delete" also expires by retention_ms; the other four tune the cleaner.
    cleanup_policy: str = DEFAULT_CLEANUP_POLICY
    min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS
    dirty_ratio: float = DEFAULT_DIRTY_RATIO
    tombstone_retention_ms: int = DEFAULT_TOMBSTONE_RETENTION_MS
    segment_roll_messages: int = DEFAULT_SEGMENT_ROLL_MESSAGES

    def __post_init__(self) -> None:
        validate_message_type(self.message_type)
        check_compaction(self.cleanup_policy, self.min_compaction_lag_ms, self.dirty_ratio,
                         self.tombstone_retention_ms, self.segment_roll_messages)
        for key in ("retention_ms", "message_size_bytes_max", "min_insync_replicas"):
            value = getattr(self, key)
            if value is None and key != "message_size_bytes_max":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidTopicError(f"topic setting {key} must be a positive integer")
        check_message_size_max(self.message_size_bytes_max)
        if not isinstance(self.unclean_leader_election, bool):
            raise InvalidTopicError("topic setting unclean_leader_election must be true or false")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopicSettings:
        return cls().merged(d)

    def merged(self, changes: Mapping[str, Any]) -> TopicSettings:
        """These settings with the named ones changed (``topic update`` changes only what it
        names); a None value restores that setting's default. Unknown names are rejected."""
        unknown = set(changes) - set(_SETTING_DEFAULTS)
        if unknown:
            raise InvalidTopicError(f"unknown topic setting(s): {', '.join(sorted(unknown))}")
        return replace(self, **{k: _SETTING_DEFAULTS[k] if v is None else v for k, v in changes.items()})

    def for_replicas(self, replication_factor: int) -> TopicSettings:
        """Resolve the min ISR default and check it fits the replication factor."""
        min_isr = self.min_insync_replicas
        if min_isr is None:
            return replace(self, min_insync_replicas=default_min_insync_replicas(replication_factor))
        if min_isr > replication_factor:
            raise InvalidTopicError(
                f"min_insync_replicas must be 1..{replication_factor} (the replication factor),"
                f" got {min_isr}"
            )
        return self


_SETTING_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(TopicSettings) if f.default is not MISSING
}
assert len(_SETTING_DEFAULTS) == len(fields(TopicSettings)), "every topic setting has a default"


# RocketMQ's consumer retry schedule (its delay levels 3..18) and retry count.
DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = tuple(s * 1000 for s in (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200))
DEFAULT_MAX_RECONSUME_TIMES = 16
RETRY_DELAYS_MAX = 64


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """A consumer group's settings (RocketMQ's subscription group config), kept in etcd: what
    its consumers use unless they are given their own. ``max_reconsume_times``: failures before
    a message goes to the dead letters (pop consumers: ``max_delivery_attempts`` = this + 1);
    ``retry_delays_ms``: the backoff of each retry (the last one repeats); ``fifo``: consumers
    process each queue (message group) in order."""

    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    retry_delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS
    fifo: bool = False

    def __post_init__(self) -> None:
        if (not isinstance(self.max_reconsume_times, int) or isinstance(self.max_reconsume_times, bool)
                or not 0 <= self.max_reconsume_times <= 1000):
            raise BadRequestError(f"max_reconsume_times must be 0..1000, not {self.max_reconsume_times!r}")
        delays = self.retry_delays_ms
        if not 1 <= len(delays) <= RETRY_DELAYS_MAX or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 7 * 24 * 3600 * 1000 for d in delays):
            raise BadRequestError(f"retry_delays_ms must be 1..{RETRY_DELAYS_MAX} delays of 0 ms .. 7 days")
        if not isinstance(self.fifo, bool):
            raise BadRequestError("fifo must be true or false")

    @property
    def max_delivery_attempts(self) -> int:
        return self.max_reconsume_times + 1

    def to_dict(self) -> dict[str, Any]:
        return {"max_reconsume_times": self.max_reconsume_times, "retry_delays_ms": list(self.retry_delays_ms),
                "fifo": self.fifo}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupSettings:
        """Settings from a request or etcd; missing ones take their defaults, unknown ones are refused."""
        unknown = set(d) - {"max_reconsume_times", "retry_delays_ms", "fifo", "v"}
        if unknown:
            raise BadRequestError(f"unknown group settings: {', '.join(sorted(unknown))}")
        defaults = cls()
        delays = d.get("retry_delays_ms", defaults.retry_delays_ms)
        if not isinstance(delays, (list, tuple)):
            raise BadRequestError("retry_delays_ms must be a list of milliseconds")
        return cls(d.get("max_reconsume_times", defaults.max_reconsume_times), tuple(delays),
                   d.get("fifo", defaults.fifo))

    def to_json(self) -> bytes:
        return _dumps({"v": LAYOUT_VERSION, **self.to_dict()})

    @classmethod
    def from_json(cls, raw: bytes) -> GroupSettings:
        return cls.from_dict(_loads(raw))


@dataclass(frozen=True, slots=True)
class QueueState:
    """Placement and partition state of one queue. The controller rewrites leader, isr and
    leader_epoch on failover, bumping the epoch to fence stale leaders; the leader broker
    rewrites isr (``ClusterMetadata.update_isr``)."""

    queue_id: int
    replicas: tuple[str, ...]  # broker ids; replicas[0] is the preferred leader
    leader: str | None  # None: offline, no eligible replica alive
    isr: tuple[str, ...]  # in-sync replicas, leader included
    leader_epoch: int = 0
    controller_epoch: int = 0  # epoch of the controller that last changed leader/epoch (0: none)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    replication_factor: int
    settings: TopicSettings
    queues: tuple[QueueState, ...] = field(default=())

    def __post_init__(self) -> None:
        # Every TopicMetadata (created, updated, decoded) carries resolved, valid settings.
        object.__setattr__(self, "settings", self.settings.for_replicas(self.replication_factor))

    @property
    def queue_count(self) -> int:
        return len(self.queues)

    def to_json(self) -> bytes:
        return _dumps(
            {
                "v": LAYOUT_VERSION,
                "name": self.name,
                "replication_factor": self.replication_factor,
                "settings": asdict(self.settings),
                "queues": [
                    {
                        "id": q.queue_id,
                        "replicas": list(q.replicas),
                        "leader": q.leader,
                        "isr": list(q.isr),
                        "leader_epoch": q.leader_epoch,
                        "controller_epoch": q.controller_epoch,
                    }
                    for q in self.queues
                ],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> TopicMetadata:
        d = _loads(raw)
        queues = tuple(
            QueueState(
                q["id"],
                tuple(q["replicas"]),
                q["leader"],
                tuple(q["isr"]),
                q["leader_epoch"],
                q.get("controller_epoch", 0),  # absent in values written before issue 5
            )
            for q in d["queues"]
        )
        return cls(d["name"], d["replication_factor"], TopicSettings(**d["settings"]), queues)

    def with_queue_count(self, queue_count: int, broker_ids: Sequence[str]) -> TopicMetadata:
        """Grow to ``queue_count`` queues, placing the new ones on ``broker_ids``."""
        validate_queue_count(queue_count)
        if queue_count < self.queue_count:
            raise InvalidTopicError(
                f"topic {self.name} has {self.queue_count} queues; queues cannot be removed"
            )
        added = place_queues(range(self.queue_count, queue_count), broker_ids, self.replication_factor)
        return replace(self, queues=self.queues + added)


def validate_queue_count(queue_count: int) -> int:
    if not isinstance(queue_count, int) or isinstance(queue_count, bool) or not (
        1 <= queue_count <= QUEUE_COUNT_MAX
    ):
        raise InvalidTopicError(f"queue count must be 1..{QUEUE_COUNT_MAX}, got {queue_count!r}")
    return queue_count


def validate_replicas(replicas: int) -> int:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not (
        1 <= replicas <= REPLICAS_MAX
    ):
        raise InvalidTopicError(f"replicas must be 1..{REPLICAS_MAX}, got {replicas!r}")
    return replicas


def place_queues(
    queue_ids: Sequence[int], broker_ids: Sequence[str], replicas: int
) -> tuple[QueueState, ...]:
    """Replica j of queue i on broker (i + j) mod n, brokers sorted by id; replica 0 leads."""
    ordered = sorted(broker_ids)
    if replicas > len(ordered):
        raise NotEnoughBrokers(replicas, len(ordered))
    n = len(ordered)
    states = []
    for i in queue_ids:
        chosen = tuple(ordered[(i + j) % n] for j in range(replicas))
        states.append(QueueState(i, chosen, chosen[0], chosen))
    return tuple(states)


def new_topic(
    name: str,
    queue_count: int,
    replicas: int,
    settings: TopicSettings,
    broker_ids: Sequence[str],
) -> TopicMetadata:
    validate_name("topic", name)
    validate_queue_count(queue_count)
    validate_replicas(replicas)
    return TopicMetadata(name, replicas, settings, place_queues(range(queue_count), broker_ids, replicas))


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _loads(raw: bytes) -> dict[str, Any]:
    d = json.loads(raw)
    if not isinstance(d, dict) or d.get("v") != LAYOUT_VERSION:
        raise ClusterError(f"unsupported metadata layout version in {raw[:80]!r}")
    return d
