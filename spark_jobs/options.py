"""The options of ``spark.read.format("gms")``, parsed and checked once into a frozen dataclass."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass

from gms.spark_jobs.schema import COLUMN_NAMES, select_columns
from gms.tags import TagFilter, parse_tag_expression
from gms.times import parse_time_ms

RECORDS_PER_PARTITION_DEFAULT = 2_000_000  # a larger queue is split into offset ranges
MIN_RECORDS_PER_PARTITION_DEFAULT = 250_000  # smaller queues share partitions (partitions.split_spans)
BATCH_RECORDS_DEFAULT = 65_536  # rows per Arrow batch handed to Spark
BATCH_BYTES_MAX = 64 << 20  # Arrow binary/string offsets are int32: stay far below 2 GiB
EARLIEST, LATEST = -2, -1  # Kafka's conventions inside startingOffsets / endingOffsets JSON


class OnCorrupt(enum.Enum):
    SKIP = "skip"  # count (accumulator + worker log) and leave the record out
    FAIL = "fail"  # raise: the job fails


class OptionError(ValueError):
    """An option value the gms data source cannot use."""


# topic -> queue id -> offset (EARLIEST / LATEST allowed); None = the same bound for every queue.
OffsetSpec = dict[str, dict[int, int]]


@dataclass(frozen=True)
class ReadOptions:
    path: str | None
    topics: tuple[str, ...] | None  # None = every topic
    tags: TagFilter
    start_time_ms: int | None
    end_time_ms: int | None  # exclusive
    starting_offsets: OffsetSpec | int  # EARLIEST / LATEST or per queue
    ending_offsets: OffsetSpec | int  # exclusive
    brokers: tuple[str, ...] | None
    nameserver: str | None
    broker_address: str | None  # names the broker of a store path, for msg_id
    on_corrupt: OnCorrupt
    columns: tuple[str, ...]
    records_per_partition: int
    batch_records: int
    group: str | None = None  # the consumer group a streaming query commits its offsets to
    min_records_per_partition: int = MIN_RECORDS_PER_PARTITION_DEFAULT

    @property
    def live(self) -> bool:
        return self.brokers is not None or self.nameserver is not None


def _time_ms(name: str, value: str | None) -> int | None:
    """The one rule of :func:`gms.times.parse_time_ms`, which the CLI's ``--from`` uses too."""
    if value is None or value == "":
        return None
    try:
        return parse_time_ms(value)
    except ValueError as err:
        raise OptionError(f"{name}: {err}") from err


def parse_offsets(name: str, value: str | None, default: int) -> OffsetSpec | int:
    """``earliest`` / ``latest`` or JSON ``{"topic": {"0": 12, "1": -2}}``."""
    if value is None or value == "":
        return default
    if value in ("earliest", "latest"):
        return EARLIEST if value == "earliest" else LATEST
    try:
        doc = json.loads(value)
        spec = {str(topic): {int(q): int(o) for q, o in queues.items()} for topic, queues in doc.items()}
    except (ValueError, AttributeError, TypeError) as err:
        raise OptionError(f"{name} must be earliest, latest or JSON {{topic: {{queue: offset}}}}: {err}") from err
    if any(o < EARLIEST for queues in spec.values() for o in queues.values()):
        raise OptionError(f"{name}: offsets are >= 0, or -2 (earliest) / -1 (latest)")
    return spec


def _positive(options: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(options.get(name, default))
    except ValueError as err:
        raise OptionError(f"{name} must be an integer") from err
    if value < 1:
        raise OptionError(f"{name} must be >= 1")
    return value


def cluster_options(opts: Mapping[str, str]) -> tuple[tuple[str, ...] | None, str | None]:
    """(brokers, nameserver) of lower-cased options: at most one of them is set."""
    brokers = tuple(b.strip() for b in opts.get("brokers", "").split(",") if b.strip()) or None
    nameserver = opts.get("nameserver") or None
    if brokers and nameserver:
        raise OptionError("give either brokers or nameserver, not both")
    return brokers, nameserver


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Spark hands options with case-insensitive keys; look them up in lower case."""
    opts = {k.lower(): v for k, v in options.items()}
    topics = tuple(t.strip() for t in opts.get("topics", "").split(",") if t.strip()) or None
    brokers, nameserver = cluster_options(opts)
    group = opts.get("group") or None
    if group is not None and brokers is None and nameserver is None:
        raise OptionError("the group option needs brokers or nameserver: its offsets are committed to the cluster")
    try:
        on_corrupt = OnCorrupt(opts.get("oncorrupt", "skip").lower())
    except ValueError as err:
        raise OptionError(f"onCorrupt must be skip or fail, not {opts.get('oncorrupt')!r}") from err
    try:
        tags = parse_tag_expression(opts.get("tags"))
        columns = select_columns(opts.get("columns"))
    except ValueError as err:
        raise OptionError(str(err)) from err
    path = opts.get("path") or None
    if path is None and brokers is None and nameserver is None:
        raise OptionError("load(STORE_DIR) a store, or set the brokers or nameserver option")
    return ReadOptions(
        path=path,
        topics=topics,
        tags=tags,
        start_time_ms=_time_ms("startTime", opts.get("starttime")),
        end_time_ms=_time_ms("endTime", opts.get("endtime")),
        starting_offsets=parse_offsets("startingOffsets", opts.get("startingoffsets"), EARLIEST),
        ending_offsets=parse_offsets("endingOffsets", opts.get("endingoffsets"), LATEST),
        brokers=brokers,
        nameserver=nameserver,
        broker_address=opts.get("brokeraddress") or None,
        on_corrupt=on_corrupt,
        columns=columns if columns else COLUMN_NAMES,
        records_per_partition=_positive(opts, "maxrecordsperpartition", RECORDS_PER_PARTITION_DEFAULT),
        batch_records=_positive(opts, "batchrecords", BATCH_RECORDS_DEFAULT),
        group=group,
        min_records_per_partition=_positive(opts, "minrecordsperpartition", MIN_RECORDS_PER_PARTITION_DEFAULT),
    )


def resolve_offset(spec: OffsetSpec | int, topic: str, queue_id: int, low: int, high: int,
                   missing: int) -> int:
    """The concrete offset a spec names for one queue (``missing`` if it names none), clamped
    to [low, high]."""
    value = spec if isinstance(spec, int) else spec.get(topic, {}).get(queue_id, missing)
    if value == EARLIEST:
        return low
    if value == LATEST:
        return high
    return min(max(value, low), high)
