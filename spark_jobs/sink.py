"""The ``gms`` sink: ``df.write.format("gms")`` and ``df.writeStream.format("gms")``.

Every Spark task sends its rows through one idempotent SDK :class:`~gms.client.Producer`
(``send_async``: batched and pipelined per queue), flushes it and checks every send's answer
before it returns, so a task (and a streaming micro-batch, whose commit follows its tasks) ends
only when the brokers acknowledged all of its rows. What is and is not exactly-once:
docs/spark.md#writing.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from gms.client.producer import ACKS_VALUES
from gms.spark_jobs.options import OptionError, cluster_options

# column -> the Spark types it may have (DataType.simpleString()).
SINK_COLUMNS: dict[str, tuple[str, ...]] = {
    "topic": ("string",),
    "body": ("binary", "string"),
    "tag": ("string",),
    "keys": ("array<string>",),
    "key": ("string", "binary"),
    "properties": ("map<string,string>",),
    "deliver_at": ("timestamp", "bigint"),  # a time, or epoch ms
}
_EXTRA_COLUMNS = ("keys", "properties", "key", "deliver_at")  # the columns a plain message has none of
ROWS_PER_CHUNK = 4096  # Spark Rows of a streaming write turned into columns at once
# One column chunk: column name -> its values, every list as long as the chunk.
Chunk = Mapping[str, list[Any]]


class SinkError(RuntimeError):
    """A row the sink cannot send, or a send the brokers did not acknowledge: the task fails."""


@dataclass(frozen=True)
class WriteOptions:
    topic: str | None  # the target of every row; overrides a topic column (as Kafka's sink does)
    brokers: tuple[str, ...] | None
    nameserver: str | None
    columns: tuple[str, ...]  # the DataFrame's columns, all of them sink columns
    acks: int
    retries: int
    linger_ms: int
    request_timeout_ms: int
    idempotence: bool


def _int(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    try:
        value = int(opts.get(name.lower(), default))
    except ValueError as err:
        raise OptionError(f"{name} must be an integer") from err
    if value < minimum:
        raise OptionError(f"{name} must be >= {minimum}")
    return value


def parse_write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    """Check the options and the DataFrame's columns on the driver, before any task runs."""
    opts = {k.lower(): v for k, v in options.items()}
    brokers, nameserver = cluster_options(opts)
    if brokers is None and nameserver is None:
        raise OptionError("writing needs the brokers or nameserver option")
    types = {field.name: field.dataType.simpleString() for field in schema.fields}
    unknown = sorted(set(types) - set(SINK_COLUMNS))
    if unknown:
        raise OptionError(f"the gms sink takes the columns {list(SINK_COLUMNS)}, not {unknown}: select them")
    for name, spark_type in types.items():
        if spark_type not in SINK_COLUMNS[name]:
            raise OptionError(f"column {name} is {spark_type}; the gms sink takes {' or '.join(SINK_COLUMNS[name])}")
    topic = opts.get("topic") or None
    if "body" not in types:
        raise OptionError("the gms sink needs a body column")
    if topic is None and "topic" not in types:
        raise OptionError("give a topic column or the topic option")
    acks = _int(opts, "acks", 1, -1)
    if acks not in ACKS_VALUES:
        raise OptionError(f"acks must be one of {ACKS_VALUES}")
    idempotence = opts.get("idempotence", "true").lower()
    if idempotence not in ("true", "false"):
        raise OptionError("idempotence must be true or false")
    return WriteOptions(topic, brokers, nameserver, tuple(types), acks, _int(opts, "retries", 10, 0),
                        _int(opts, "lingerMs", 5, 0), _int(opts, "requestTimeoutMs", 30_000, 1),
                        idempotence == "true")


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What one task acknowledged."""

    rows: int


def _arrow_values(column: pa.Array) -> list[Any]:
    if pa.types.is_timestamp(column.type):  # epoch-based whatever its zone: to ms, no local-time guess
        divisor = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
        ints = pc.cast(column, pa.int64())
        return (pc.multiply(ints, 1000) if divisor is None else pc.divide(ints, divisor)).to_pylist()
    return column.to_pylist()


def arrow_chunks(batches: Iterable[pa.RecordBatch]) -> Iterator[Chunk]:
    """Arrow batches in column chunks; a string body is cast to its UTF-8 bytes in Arrow."""
    for batch in batches:
        chunk = {name: _arrow_values(batch.column(name)) for name in batch.schema.names if name != "body"}
        body = batch.column("body")
        chunk["body"] = (pc.cast(body, pa.binary()) if pa.types.is_string(body.type) else body).to_pylist()
        yield chunk


def _as_bytes(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else bytes(value) if isinstance(value, bytearray) else value


def row_chunks(rows: Iterable[Any], columns: tuple[str, ...]) -> Iterator[Chunk]:
    """Spark Rows in column chunks (a timestamp is a naive local datetime, which the SDK reads so)."""
    def columns_of(chunk: list[Any]) -> Chunk:
        values = {name: [r[name] for r in chunk] for name in columns}
        values["body"] = list(map(_as_bytes, values["body"]))
        return values

    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == ROWS_PER_CHUNK:
            yield columns_of(chunk)
            chunk = []
    if chunk:
        yield columns_of(chunk)


def _failed(outcome: Any) -> SinkError | None:
    err = outcome.exception()
    return None if err is None else SinkError(f"a message was not acknowledged: {err!r}")


_batch_of = operator.attrgetter("_batch")  # a SendFuture's batch, shared by its rows


def _outcomes(futures: Iterable[Any]) -> Iterable[Any]:
    """The outcomes of the batches ``futures`` went into, once each: a batch holds thousands of
    rows, so its answer is checked once rather than once a row. (A handle refers to its batch,
    which holds the outcome, or to an outcome itself.)"""
    return [getattr(batch, "outcome", batch) for batch in dict.fromkeys(map(_batch_of, futures))]


def _futures(send: Any, topics: list[Any], chunk: Chunk) -> Iterable[Any]:
    """``send_async`` each row of a checked chunk: with the arguments the chunk's columns give."""
    bodies = chunk["body"]
    tags = chunk.get("tag") or [None] * len(bodies)
    if not any(name in chunk for name in _EXTRA_COLUMNS):  # the usual, plain message
        return map(send, topics, bodies, tags)
    none = [None] * len(bodies)
    keys, properties, key, deliver_at = (chunk.get(name, none) for name in _EXTRA_COLUMNS)
    return (send(topic, body, tag, row_keys or (), dict(props) if props else None, key=row_key, deliver_at=at)
            for topic, body, tag, row_keys, props, row_key, at in zip(topics, bodies, tags, keys, properties, key,
                                                                     deliver_at, strict=True))


def send_chunks(options: WriteOptions, chunks: Iterable[Chunk], counter: Any = None) -> SinkCommit:
    """Send every row; returns once all are acknowledged (and adds their count to ``counter``),
    raises SinkError at the first bad row or failed send (rows sent before it may be stored: a
    failed task is not rolled back)."""
    from gms.client import Producer

    sent = 0
    pending: collections.deque[Any] = collections.deque()  # batches' outcomes, in about the order sent
    with Producer(list(options.brokers) if options.brokers else None, nameserver=options.nameserver,
                  acks=options.acks, retries=options.retries, linger_ms=options.linger_ms,
                  request_timeout_ms=options.request_timeout_ms, idempotence=options.idempotence) as producer:
        for chunk in chunks:
            count = len(chunk["body"])
            topics = [options.topic] * count if options.topic else chunk["topic"]
            for name, values in (("body", chunk["body"]), ("topic", topics)):
                if None in values:
                    raise SinkError(f"row {sent + values.index(None)} has no {name}")
            pending.extend(_outcomes(_futures(producer.send_async, topics, chunk)))
            sent += count
            while pending and pending[0].done():  # answers come in about the order sent: keep few
                if err := _failed(pending.popleft()):
                    raise err
        producer.flush()
    for outcome in pending:
        if err := _failed(outcome):
            raise err
    if counter is not None:
        counter.add(sent)
    return SinkCommit(sent)
