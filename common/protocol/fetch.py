"""FETCH, the multi-queue fetch (Kafka's Fetch): one request per broker names every queue the
consumer reads there, the answer carries the records of those that have any. The one schema of
its fields, shared by the broker's handler and the SDK's fetcher.

Its rows are NamedTuples (their callers unpack them), each with its :mod:`gms.protocol.rows`
schema: :data:`QUEUE_FETCH` and :data:`FETCHED_QUEUE`.

Request fields:

- ``queues``: :class:`QueueFetch` rows ``[topic, queue_id, offset]``, 1..FETCH_QUEUES_MAX of them,
  each queue once; ``offset`` EARLIEST (-1) reads from the queue's first record, LATEST (-2) from
  its end (the answer's row says where that is, as Kafka's ListOffsets would);
- ``filters``: ``{topic: [tags, sql]}`` (a topic left out reads everything: ``["*", ""]``);
- ``max_msgs`` / ``max_bytes``: per queue; ``max_total_bytes``: the whole answer (each at least one
  record); ``poll_ms``: how long to wait for the first record; ``group`` / ``member``: a clustering
  member's claims, as PULL takes them.

Answer fields: ``queues``, a :class:`FetchedQueue` row per queue with something to say (records,
a new next offset, or an error of that queue alone) ``[topic, queue_id, status, next_offset,
min_offset, max_offset, size, error, damaged]``; the body holds the rows' records back to back,
``size`` bytes each in row order. ``status`` is a wire status (SUCCESS, or e.g. OFFSET_ILLEGAL, NOT_LEADER, QUEUE_HELD,
TOPIC_NOT_FOUND, FORBIDDEN) with ``error`` its message; ``damaged``: ``[offset, phys_offset]`` of
records whose CRC failed, left out of the body and passed. ``crc_checked``: the broker checked
every record's CRC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gms.errors import BadRequestError, GmsError
from gms.protocol.codes import Status
from gms.protocol.fields import INT32, INT64, field
from gms.protocol.rows import ARRAY, I32, I64, QUEUE_ID, STR, TOPIC, col, encode, wire_row

# Queues one FETCH may name: far more than one consumer leads on a broker in practice, and the
# request (and its answer's rows) stays well below the 1 MiB header bound.
FETCH_QUEUES_MAX = 10_000
FETCH_MSGS_MAX = 4096
FETCH_BYTES_MAX = 16 << 20  # per queue
FETCH_TOTAL_BYTES_MAX = 64 << 20
FETCH_TOTAL_BYTES_DEFAULT = 16 << 20
EARLIEST = -1  # a row's offset: from the queue's first record
LATEST = -2  # a row's offset: from the queue's end


class QueueFetch(NamedTuple):
    topic: str
    queue_id: int
    offset: int


QUEUE_FETCH = wire_row(
    QueueFetch,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    offset=col(I64, "where to read from; −1: the queue's first record, −2: its end"),
)


class FetchRequest(NamedTuple):
    queues: list[QueueFetch]
    filters: dict[str, tuple[str, str]]  # topic -> (tag expression, SQL expression or "")
    max_msgs: int
    max_bytes: int
    max_total_bytes: int
    poll_ms: int
    group: str
    member: str

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "queues": self.queues,  # rows are tuples: msgpack writes them as arrays
            "filters": {topic: list(f) for topic, f in self.filters.items() if f != ("*", "")},
            "max_msgs": self.max_msgs, "max_bytes": self.max_bytes, "max_total_bytes": self.max_total_bytes,
            "poll_ms": self.poll_ms}
        if self.member:
            fields.update(group=self.group, member=self.member)
        return fields


def _bounded(fields: Mapping[str, Any], name: str, low: int, high: int, default: int) -> int:
    return min(max(field(fields, name, INT64, default), low), high)


def _queue_rows(rows: list[Any]) -> list[QueueFetch]:
    """The request's rows: one that is a list of str, int, int within their widths is made as it
    is (a FETCH may name thousands), any other is decoded by its schema (which names the fault)."""
    make, decode = QueueFetch._make, QUEUE_FETCH.decode
    low32, high32, low64, high64 = INT32.low, INT32.high, INT64.low, INT64.high
    return [make(row) if (type(row) is list and len(row) == 3 and type(row[0]) is str
                          and type(row[1]) is int and low32 <= row[1] <= high32
                          and type(row[2]) is int and low64 <= row[2] <= high64)
            else decode(row, "queues") for row in rows]


def decode_fetch_request(fields: Mapping[str, Any], poll_ms_max: int) -> FetchRequest:
    """The request checked: BadRequestError names the malformed field (or too many queues)."""
    rows = field(fields, "queues", list)
    if not 1 <= len(rows) <= FETCH_QUEUES_MAX:
        raise BadRequestError(f"'queues' must list 1..{FETCH_QUEUES_MAX} queues, not {len(rows)}")
    queues = _queue_rows(rows)
    if len({q[:2] for q in queues}) != len(queues):
        raise BadRequestError("'queues' names a queue more than once")
    filters: dict[str, tuple[str, str]] = {}
    for topic, value in field(fields, "filters", dict, {}).items():
        if (not isinstance(value, list) or len(value) != 2
                or not all(isinstance(v, str) for v in value)):
            raise BadRequestError(f"'filters' must map topics to [tags, sql], not {value!r} for {topic!r}")
        filters[topic] = (value[0], value[1])
    return FetchRequest(
        queues, filters,
        max_msgs=_bounded(fields, "max_msgs", 1, FETCH_MSGS_MAX, 32),
        max_bytes=_bounded(fields, "max_bytes", 1, FETCH_BYTES_MAX, 1 << 20),
        max_total_bytes=_bounded(fields, "max_total_bytes", 1, FETCH_TOTAL_BYTES_MAX, FETCH_TOTAL_BYTES_DEFAULT),
        poll_ms=_bounded(fields, "poll_ms", 0, poll_ms_max, 0),
        group=field(fields, "group", str, ""), member=field(fields, "member", str, ""))


class FetchedQueue(NamedTuple):
    """One answer row: what became of one queue."""

    topic: str
    queue_id: int
    status: int
    next_offset: int
    min_offset: int
    max_offset: int
    size: int  # bytes of the body holding its records
    error: str = ""
    damaged: Sequence[Sequence[int]] = ()  # [queue offset, commitlog offset] of records left out

    @classmethod
    def failed(cls, queue: QueueFetch, err: GmsError) -> FetchedQueue:
        """The row of a queue whose read failed with ``err`` (its position unchanged)."""
        bounds = err.fields or {}
        return cls(queue.topic, queue.queue_id, int(err.status), queue.offset, int(bounds.get("min_offset", 0)),
                   int(bounds.get("max_offset", 0)), 0, str(err))

    def row(self) -> list[Any]:
        return list(encode(self))


FETCHED_QUEUE = wire_row(
    FetchedQueue, required=9,  # its defaults serve the broker building rows
    topic=TOPIC,
    queue_id=QUEUE_ID,
    status=col(I32, "SUCCESS (0) or the wire status of this queue's own error"),
    next_offset=col(I64, "where the next read of the queue starts (past entries skipped: unmatched tags, expired,"
                         " damaged; or where −1/−2 lie)"),
    min_offset=col(I64, "the queue's first offset"),
    max_offset=col(I64, "its end (the high watermark on a replicated queue)"),
    size=col(I64, "bytes of the body holding the queue's records"),
    error=col(STR, "the error's message (empty: none)"),
    damaged=col(ARRAY, "`[[queue_offset, commitlog_offset], ...]` of records whose CRC failed: left out of the body"
                       " and passed"),
)


def decode_fetch_answer(fields: Mapping[str, Any], body_size: int) -> list[FetchedQueue]:
    """The answer's rows, checked against the schema and the body's size (BadRequestError: a
    broker that does not speak this schema)."""
    rows = fields.get("queues")
    if not isinstance(rows, list):
        raise BadRequestError("FETCH answer without 'queues'")
    make, decode = FetchedQueue._make, FETCHED_QUEUE.decode
    low32, high32, low64, high64 = INT32.low, INT32.high, INT64.low, INT64.high
    # A row of the kinds and widths of the schema's columns is made as it is (an answer may hold
    # thousands); any other is decoded by the schema (a newer broker's longer row, or a fault).
    found: list[FetchedQueue] = [
        make(row) if (type(row) is list and len(row) == 9 and type(row[0]) is str
                      and type(row[1]) is int and low32 <= row[1] <= high32
                      and type(row[2]) is int and low32 <= row[2] <= high32
                      and type(row[3]) is int and low64 <= row[3] <= high64
                      and type(row[4]) is int and low64 <= row[4] <= high64
                      and type(row[5]) is int and low64 <= row[5] <= high64
                      and type(row[6]) is int and low64 <= row[6] <= high64
                      and type(row[7]) is str and type(row[8]) is list)
        else decode(row, "queues") for row in rows]
    total = sum(fetched.size for fetched in found)
    if total != body_size:
        raise BadRequestError(f"FETCH answer rows hold {total} bytes, its body {body_size}")
    return found


OK = int(Status.SUCCESS)
