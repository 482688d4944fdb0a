"""The trace record format (docs/traces.md): how traced clients write events and how
``Admin.trace`` / ``gms msg trace`` read them back.

A trace record is an ordinary message of the trace topic:

- **keys**: the *regions* of the messages the record is about (one record covers a whole
  batch: a ``send_batch``, a poll): a message id without its last four hex digits, that is its
  broker and 64 KiB of that broker's commitlog (:func:`region_key`). The brokers' key index finds
  the record by any of them with one entry per region, not one per message;
- **ids**: in the body, the ids of the messages as runs of one broker each, in order:
  ``[[prefix, base64 of their offsets as big-endian uint64], ...]`` (:func:`pack_ids`): the
  order the per-message fields follow;
- **tag**: the event (``send``, ``deliver``, ``ack``, ``retry``, ``dead-letter``);
- **body**: compact JSON, one object: ``v`` (format version), ``event``, ``time_us`` (epoch µs),
  ``host``, ``client`` and the event's fields (see :data:`EVENT_FIELDS`). A field is either one
  value for every message of the record, or — a JSON list — one value per message, in the order
  of ``ids``; a column of integers may be packed: ``{"b64": ..., "dtype": ">i4"}``, the base64
  of the big-endian array. ``offset_from`` is a run of queue offsets (message i at
  ``offset_from + i``). ``keys`` (a message's own keys) is one space-separated string per message.

A ``send`` record stands for two rows of a timeline: the send (producer side) and the store
(the broker that answered, its queue and offset; the time is the message's store time when the
message is still there, else when the producer got the answer).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from gms.record import KEYS_BYTES_MAX

TRACE_TOPIC = "gms_trace"  # RocketMQ's RMQ_SYS_TRACE_TOPIC: created on first use by traced clients
TRACE_QUEUES = 4  # queues of the trace topic when a client creates it
FORMAT_VERSION = 1

SEND, STORE, DELIVER, ACK, RETRY, DEAD_LETTER = "send", "store", "deliver", "ack", "retry", "dead-letter"
# Rows of one time sort in the order a message lives them (clocks have a resolution).
EVENT_RANK = {SEND: 0, STORE: 1, DELIVER: 2, RETRY: 3, DEAD_LETTER: 3, ACK: 4}
EVENT_FIELDS = {
    SEND: "topic, queue, offset (or offset_from), broker, tag, keys, size (body bytes), born_ms, cost_us, status",
    DELIVER: "group, topic, queue, offset (of the delivered copy: a retry topic's for a retry), attempt (1: first)",
    ACK: "group, cost_us (from delivery to ack)",
    RETRY: "group, attempt (the failed one), delay_ms, reason, to (the retry topic), copy_id",
    DEAD_LETTER: "group, attempt, reason, to (the dead-letter topic), copy_id",
}
# Messages one record covers; its region keys (IPv6 ids are 48 characters) must fit a record's keys.
IDS_PER_RECORD_MAX = 1024
REGION_HEX_DIGITS = 4  # the id digits a region key drops: 64 KiB of a broker's commitlog
assert IDS_PER_RECORD_MAX * (48 - REGION_HEX_DIGITS + 1) <= KEYS_BYTES_MAX


def region_key(msg_id: str) -> str:
    """The key the trace records of ``msg_id`` are found by: its broker and 64 KiB region."""
    return msg_id[:-REGION_HEX_DIGITS]


def region_keys(ids: Sequence[str]) -> list[str]:
    """The keys of a record about ``ids`` (messages of one batch share one or a few regions)."""
    return sorted({msg_id[:-REGION_HEX_DIGITS] for msg_id in ids})

_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8)


def msg_ids(prefix: str, phys_offsets: np.ndarray) -> list[str]:
    """The ids of the messages at ``phys_offsets`` of the broker whose id prefix is ``prefix``
    (as ``f"{prefix}{offset:016X}"``, without a Python step per message)."""
    count = len(phys_offsets)
    if not count:
        return []
    raw = np.ascontiguousarray(phys_offsets, ">i8").view(np.uint8).reshape(count, 8)
    head = np.frombuffer(prefix.encode(), np.uint8)
    rows = np.empty((count, len(head) + 17), np.uint8)
    rows[:, :len(head)] = head
    rows[:, len(head):-1:2] = _HEX_DIGITS[raw >> 4]
    rows[:, len(head) + 1::2] = _HEX_DIGITS[raw & 15]
    rows[:, -1] = 0x20
    return rows.tobytes()[:-1].decode().split(" ")


_NIBBLES = np.zeros(256, np.uint64)  # ASCII hex digit -> its value
_NIBBLES[np.frombuffer(b"0123456789ABCDEF", np.uint8)] = np.arange(16, dtype=np.uint64)
_NIBBLES[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint64)
_OFFSET_DIGITS = 16  # an id ends with its commitlog offset in 16 hex digits


def pack_ids(ids: Sequence[str]) -> list[list[str]]:
    """Message ids as runs of one broker each, in order: ``[[prefix, base64 of the offsets as
    >i8], ...]`` (about 11 bytes a message instead of 33), without a Python step per id when the
    ids are of one length (one address family)."""
    count = len(ids)
    width = len(ids[0])
    joined = " ".join(ids).encode()
    if len(joined) != count * (width + 1) - 1:  # mixed lengths: the plain way
        offsets = np.array([int(i[-_OFFSET_DIGITS:], 16) for i in ids], np.uint64)
        starts = [0] + [k for k in range(1, count) if ids[k][:-_OFFSET_DIGITS] != ids[k - 1][:-_OFFSET_DIGITS]]
    else:
        rows = np.frombuffer(joined + b" ", np.uint8).reshape(count, width + 1)[:, :width]
        digits = _NIBBLES[rows[:, width - _OFFSET_DIGITS:]]
        offsets = np.zeros(count, np.uint64)
        for k in range(_OFFSET_DIGITS):
            offsets = (offsets << np.uint64(4)) | digits[:, k]
        head = rows[:, :width - _OFFSET_DIGITS]
        starts = [0, *(np.flatnonzero((head[1:] != head[:-1]).any(axis=1)) + 1).tolist()]
    ends = [*starts[1:], count]
    return [[ids[a][:-_OFFSET_DIGITS], base64.b64encode(offsets[a:b].astype(">u8").tobytes()).decode()]
            for a, b in zip(starts, ends, strict=True)]


def id_index(packed: Sequence[Sequence[str]], msg_id: str) -> int:
    """Where ``msg_id`` is among ids packed by :func:`pack_ids` (ValueError: not there)."""
    prefix, wanted = msg_id[:-_OFFSET_DIGITS], int(msg_id[-_OFFSET_DIGITS:], 16)
    base = 0
    for run_prefix, encoded in packed:
        offsets = np.frombuffer(base64.b64decode(encoded), ">u8")
        if run_prefix == prefix:
            hit = np.flatnonzero(offsets == wanted)
            if hit.size:
                return base + int(hit[0])
        base += len(offsets)
    raise ValueError(f"{msg_id} is not among the record's messages")


def column(values: Sequence[Any]) -> Any:
    """A field of many messages: one value when all share it, else the list."""
    first = values[0]
    return first if values.count(first) == len(values) else list(values)


def int_column(values: np.ndarray, dtype: str = ">i8") -> Any:
    """A field of integers of many messages: one value when all share it, else packed (base64 of
    the array: no Python int per message on either side)."""
    if not len(values) or (values == values[0]).all():
        return int(values[0]) if len(values) else None
    return {"b64": base64.b64encode(np.ascontiguousarray(values, dtype).tobytes()).decode(), "dtype": dtype}


def offsets_field(offsets: Sequence[int] | np.ndarray) -> dict[str, Any]:
    """Queue offsets as ``offset_from`` when they run up by one (a batch to one queue), else a column."""
    values = np.asarray(offsets, np.int64)
    if len(values) and (np.diff(values) == 1).all():
        return {"offset_from": int(values[0])}
    return {"offset": int_column(values)}


def encode_body(fields: Mapping[str, Any]) -> bytes:
    return json.dumps({"v": FORMAT_VERSION, **fields}, separators=(",", ":")).encode()


class TraceEvent(NamedTuple):
    """One row of a message's timeline."""

    time_us: int  # epoch microseconds (the writer's clock)
    event: str  # send, store, deliver, ack, retry, dead-letter
    msg_id: str
    host: str = ""  # where the client ran (the broker's address for store)
    client: str = ""  # the producer's or consumer's client id
    group: str = ""
    broker: str = ""
    topic: str = ""
    queue_id: int | None = None
    queue_offset: int | None = None
    attempt: int | None = None
    cost_us: int | None = None
    details: Mapping[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "details": dict(self.details)}


_COMMON = ("v", "ids", "event", "time_us", "host", "client", "group", "broker", "topic", "queue", "offset",
           "offset_from", "attempt", "cost_us")


def decode_events(body: bytes, msg_id: str) -> list[TraceEvent]:
    """The rows of one trace record (its body) about ``msg_id`` ([] if none; a record of an
    unknown format version gives one row saying so)."""
    try:
        fields = json.loads(body)
    except ValueError:
        return []
    if not isinstance(fields, dict) or fields.get("v") != FORMAT_VERSION:
        return [TraceEvent(0, "unknown", msg_id, details={"format": fields.get("v") if isinstance(fields, dict)
                                                          else None})]
    try:
        index = id_index(fields.get("ids", []), msg_id)
    except (ValueError, TypeError):
        return []  # another message of the same region

    def at(name: str, default: Any = None) -> Any:
        value = fields.get(name, default)
        if isinstance(value, dict) and "b64" in value:
            return int(np.frombuffer(base64.b64decode(value["b64"]), value["dtype"])[index])
        return value[index] if isinstance(value, list) else value

    offset = at("offset")
    if offset is None and "offset_from" in fields:
        offset = fields["offset_from"] + index
    common = {"host": at("host", ""), "client": at("client", ""), "group": at("group", ""),
              "topic": at("topic", ""), "queue_id": at("queue"), "queue_offset": offset}
    details = {name: at(name) for name in fields if name not in _COMMON}
    event = fields.get("event", "")
    if event != SEND:
        return [TraceEvent(at("time_us", 0), event, msg_id, broker=at("broker", ""), attempt=at("attempt"),
                           cost_us=at("cost_us"), details=details, **common)]
    acked_us = at("time_us", 0)
    cost_us = at("cost_us") or 0
    born_ms = details.pop("born_ms", None)
    sent_us = acked_us - cost_us if born_ms is None else born_ms * 1000
    broker = at("broker", "")
    send = TraceEvent(sent_us, SEND, msg_id, cost_us=cost_us, broker=broker, details=details, **common)
    store = TraceEvent(acked_us, STORE, msg_id, host=broker, broker=broker, topic=common["topic"],
                       queue_id=common["queue_id"], queue_offset=offset, details={"time": "acknowledged"})
    return [send, store]


def ordered(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    return sorted(events, key=lambda e: (e.time_us, EVENT_RANK.get(e.event, 5)))
