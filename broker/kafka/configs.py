"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and CreatePartitions: a topic's gms
settings under Kafka's config names, changed through the topic service (the nameservers' topic
update, or a broker without nameservers its own), and CreateTopics' configs read the same way.

A topic's configs are the gms settings that map onto Kafka's (``retention.ms``,
``max.message.bytes``, ``min.insync.replicas``, ``unclean.leader.election.enable``,
``cleanup.policy``, ``min.compaction.lag.ms``, ``min.cleanable.dirty.ratio``,
``delete.retention.ms``), and gms's own under a ``gms.`` prefix (``gms.message.type``,
``gms.segment.roll.messages``). A broker's are a few read-only ones (its defaults). Any other
config name, a value gms cannot keep (retention.ms -1: gms keeps records for a finite time) and a
list operation answer INVALID_CONFIG, so nothing is silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gms.broker.kafka.errors import Err, code_of
from gms.broker.services import Services
from gms.cluster.model import TopicSettings
from gms.errors import GmsError, InvalidTopicError

TOPIC, BROKER = 2, 4  # Kafka's config resource types
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5  # Kafka's config sources
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7  # Kafka's config types
SET, DELETE = 0, 1  # IncrementalAlterConfigs' operations (APPEND 2 and SUBTRACT 3 are for lists)
MIN_ISR = "min_insync_replicas"  # kept by AlterConfigs unless given: its default depends on the replicas
WAIT_S = 10.0  # how long a change waits for this broker's view of it


class ConfigError(Exception):
    """A config gms cannot take: INVALID_CONFIG with this message."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise ConfigError(f"{value}: gms takes a positive value (a finite retention, a size)")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{value}: must be >= 0")
    return value


def _ratio(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{text!r} is not a number") from None


def _cleanup_policy(text: str) -> str:
    """Kafka's list (``compact,delete`` in either order) as gms's setting."""
    parts = sorted({part.strip() for part in text.split(",") if part.strip()})
    return ",".join(parts)


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ConfigError(f"{text!r} is not true or false")
    return text.lower() == "true"


@dataclass(frozen=True, slots=True)
class _Config:
    setting: str  # the gms topic setting
    kind: int  # Kafka's config type
    parse: Callable[[str], Any]


TOPIC_CONFIGS = {
    "retention.ms": _Config("retention_ms", LONG, _positive),
    "max.message.bytes": _Config("message_size_bytes_max", INT, _positive),
    "min.insync.replicas": _Config("min_insync_replicas", INT, _positive),
    "unclean.leader.election.enable": _Config("unclean_leader_election", BOOLEAN, _boolean),
    "gms.message.type": _Config("message_type", STRING, str),
    "cleanup.policy": _Config("cleanup_policy", LIST, _cleanup_policy),
    "min.compaction.lag.ms": _Config("min_compaction_lag_ms", LONG, _non_negative),
    "min.cleanable.dirty.ratio": _Config("dirty_ratio", DOUBLE, _ratio),
    "delete.retention.ms": _Config("tombstone_retention_ms", LONG, _non_negative),
    "gms.segment.roll.messages": _Config("segment_roll_messages", INT, _positive),
}
_DEFAULTS = {config.setting: getattr(TopicSettings(), config.setting) for config in TOPIC_CONFIGS.values()}


def topic_settings(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """gms settings from Kafka topic configs (name, value; a null value: the default).
    ConfigError for a name or value gms cannot keep."""
    settings: dict[str, Any] = {}
    for name, value in configs:
        config = TOPIC_CONFIGS.get(name)
        if config is None:
            raise ConfigError(f"gms has no topic config {name} (it has {', '.join(TOPIC_CONFIGS)})")
        if value is None and config.setting == MIN_ISR:
            raise ConfigError(f"{name} has no default to go back to (it follows the replication factor): set it")
        try:
            settings[config.setting] = None if value is None else config.parse(value)
        except ConfigError as err:
            raise ConfigError(f"{name}: {err}") from None
    try:
        TopicSettings().merged({k: v for k, v in settings.items() if v is not None})  # checks the values
    except InvalidTopicError as err:
        raise ConfigError(str(err)) from None
    return settings


def _row(name: str, value: object, source: int, kind: int, read_only: bool = False) -> dict[str, Any]:
    text = None if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return {"name": name, "value": text, "read_only": read_only, "is_default": source == DEFAULT_CONFIG,
            "config_source": source, "is_sensitive": False, "synonyms": [], "config_type": kind,
            "documentation": None}


class Configs:
    def __init__(self, services: Services, default_queue_count: int) -> None:
        self.topics = services.topics
        self.default_queue_count = default_queue_count

    def describe_configs(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        results = []
        for resource in req["resources"]:
            kind, name, keys = resource["resource_type"], resource["resource_name"], resource["configuration_keys"]
            row: dict[str, Any] = {"resource_type": kind, "resource_name": name, "error_code": 0,
                                   "error_message": None, "configs": []}
            try:
                if kind == TOPIC:
                    configs = self._topic_configs(name)
                elif kind == BROKER:
                    configs = self._broker_configs()
                else:
                    raise _Refused(Err.INVALID_REQUEST, f"gms serves no configs of resource type {kind}")
            except _Refused as err:
                results.append({**row, "error_code": err.code, "error_message": err.message})
                continue
            row["configs"] = [c for c in configs if keys is None or c["name"] in keys]
            results.append(row)
        return {"results": results}

    def _topic_configs(self, topic: str) -> list[dict[str, Any]]:
        settings = self._settings(topic)
        rows = []
        for name, config in TOPIC_CONFIGS.items():
            if config.setting not in settings:  # a broker without nameservers keeps fewer
                continue
            value = settings[config.setting]
            default = value is None or value == _DEFAULTS[config.setting]
            if value is None:  # the broker's retention; a broker without nameservers' default type
                value = self.topics.default_retention_ms() if config.setting == "retention_ms" else (
                    None if config.setting == "message_size_bytes_max" else _DEFAULTS[config.setting])
            rows.append(_row(name, value, DEFAULT_CONFIG if default else DYNAMIC_TOPIC_CONFIG, config.kind))
        return rows

    def _broker_configs(self) -> list[dict[str, Any]]:
        return [_row(name, value, STATIC_BROKER_CONFIG, kind, read_only=True) for name, value, kind in (
            ("num.partitions", self.default_queue_count, INT), ("default.replication.factor", 1, INT),
            ("log.retention.ms", self.topics.default_retention_ms(), LONG),
            ("auto.create.topics.enable", False, BOOLEAN))]

    def _settings(self, topic: str) -> dict[str, Any]:
        if topic not in self.topics.queue_counts():
            raise _Refused(Err.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic}")
        try:
            return self.topics.topic_settings(topic)
        except GmsError as err:
            raise _Refused(code_of(err), str(err)) from err

    async def alter_configs(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        """The configs given replace the topic's: those not given go back to their defaults (but
        min.insync.replicas, kept unless given)."""
        async def alter(resource: dict[str, Any]) -> dict[str, Any]:
            settable = set(self._settings(resource["resource_name"])) - {MIN_ISR}
            given = [(c["name"], c["value"]) for c in resource["configs"]]
            return {**dict.fromkeys(settable), **topic_settings(given)}
        return {"responses": [await self._alter(r, req["validate_only"], alter) for r in req["resources"]]}

    async def incremental_alter_configs(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        """SET changes a config, DELETE takes it back to its default; the others stay."""
        async def alter(resource: dict[str, Any]) -> dict[str, Any]:
            self._settings(resource["resource_name"])
            given = []
            for config in resource["configs"]:
                if config["config_operation"] not in (SET, DELETE):
                    raise ConfigError(f"{config['name']} is not a list: only SET and DELETE change it")
                given.append((config["name"], config["value"] if config["config_operation"] == SET else None))
            return topic_settings(given)
        return {"responses": [await self._alter(r, req["validate_only"], alter) for r in req["resources"]]}

    async def _alter(self, resource: dict[str, Any], validate_only: bool,
                     settings_of: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        kind, name = resource["resource_type"], resource["resource_name"]
        row = {"resource_type": kind, "resource_name": name, "error_code": 0, "error_message": None}
        try:
            if kind != TOPIC:
                raise _Refused(Err.INVALID_CONFIG if kind == BROKER else Err.INVALID_REQUEST,
                               "gms's broker configs are its command line's (gms-broker --help): read-only here"
                               if kind == BROKER else f"gms serves no configs of resource type {kind}")
            settings = await settings_of(resource)
            if settings and not validate_only:
                await self.topics.update_in_cluster(name, None, settings, WAIT_S)
        except ConfigError as err:
            return {**row, "error_code": Err.INVALID_CONFIG, "error_message": str(err)}
        except _Refused as err:
            return {**row, "error_code": err.code, "error_message": err.message}
        except GmsError as err:
            code = Err.INVALID_CONFIG if isinstance(err, InvalidTopicError) else code_of(err)
            return {**row, "error_code": code, "error_message": str(err)}
        return row

    async def create_partitions(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        timeout_s = min(max(req["timeout_ms"], 0) / 1000, WAIT_S)
        results = []
        for topic in req["topics"]:
            name, count = topic["name"], topic["count"]
            code, message = Err.NONE, None
            current = self.topics.queue_counts().get(name)
            if current is None:
                code, message = Err.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}"
            elif topic["assignments"] is not None:
                code, message = Err.INVALID_REQUEST, "manual replica assignments: gms places the queues"
            elif count <= current:
                code, message = Err.INVALID_PARTITIONS, f"topic {name} has {current} partitions: it can only grow"
            elif not req["validate_only"]:
                try:
                    await self.topics.update_in_cluster(name, count, {}, timeout_s)
                except GmsError as err:
                    code, message = code_of(err), str(err)
            results.append({"name": name, "error_code": code, "error_message": message})
        return {"results": results}


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
