"""Public values of the SDK: what a send returns and what a consumer receives.

A consumer may hand out a million messages a second, so what ``poll`` returns is
:class:`ReceivedMessages`: record positions in the fetched response buffers, making a
:class:`ReceivedMessage` (a three-slot view) only for the message asked for; its fields are
decoded from the record on access (the layout is :mod:`gms.record`'s), never eagerly.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate, chain, repeat
from typing import Any, NamedTuple, overload

import numpy as np

from gms.errors import GmsError
from gms.record import (
    HEADER_SIZE,
    OFF_PHYS_OFFSET,
    OFF_QUEUE_ID,
    OFF_QUEUE_OFFSET,
    OFF_STORE_TS,
    OFFSETS,
    Record,
    decode_keys,
    decode_properties,
    decode_record,
)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# body_len .. props_len: the lengths that locate the variable part.
_LENGTHS = struct.Struct(">iBBBxHH")
_OFF_LENGTHS = OFFSETS["body_len"]
_OFF_BORN_TS = OFFSETS["born_ts_ms"]
_OFF_RECONSUME = OFFSETS["reconsume_times"]


class SendResult(NamedTuple):
    """Where the broker stored one message."""

    msg_id: str  # encodes the broker address and commitlog offset (see gms.msgid)
    topic: str
    queue_id: int
    queue_offset: int
    broker: str  # "host:port" of the broker that stored it


class DamagedRecord(NamedTuple):
    """A stored record whose CRC fails on the broker: its queue offset is passed, never served
    as data (the consumer skips it, counts it and tells the application)."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str  # broker address and commitlog offset, as for a message


class DamagedRecordError(GmsError):
    """Raised by ``Consumer.poll`` for a damaged record when the consumer was created with
    ``damaged="raise"``; the record is passed, so the next poll goes on after it."""

    def __init__(self, record: DamagedRecord) -> None:
        super().__init__(f"damaged record (CRC mismatch on the broker) at {record.topic}/{record.queue_id}"
                         f"@{record.queue_offset}, id {record.msg_id}")
        self.record = record


class _ListLike(Sequence[Any]):
    """Equality and ``+`` of a lazy sequence that stands in for a list."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Sequence[Any]) -> list[Any]:
        return [*other, *self]


class SendResults(_ListLike, Sequence[SendResult]):
    """The results of one batch send, in input order, made on access.

    A batch of thousands of messages would otherwise build as many :class:`SendResult` tuples
    and message-id strings that most callers never look at; this keeps the response's arrays
    and builds the one asked for. Compares equal to, and concatenates with, lists.
    """

    __slots__ = ("_broker", "_phys_offsets", "_prefix", "_queue_ids", "_queue_offsets", "_topic")

    def __init__(self, topic: str, broker: str, msg_id_prefix: str, queue_ids: np.ndarray,
                 queue_offsets: np.ndarray, phys_offsets: np.ndarray) -> None:
        self._topic = topic
        self._broker = broker
        self._prefix = msg_id_prefix
        self._queue_ids = queue_ids
        self._queue_offsets = queue_offsets
        self._phys_offsets = phys_offsets

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def broker(self) -> str:
        return self._broker

    @classmethod
    def concat(cls, parts: Sequence[SendResults]) -> SendResults:
        """The results of ``parts`` one after the other (all of one topic and broker)."""
        first = parts[0]
        return cls(first._topic, first._broker, first._prefix,
                   np.concatenate([p._queue_ids for p in parts]),
                   np.concatenate([p._queue_offsets for p in parts]),
                   np.concatenate([p._phys_offsets for p in parts]))

    def __len__(self) -> int:
        return len(self._phys_offsets)

    @overload
    def __getitem__(self, index: int) -> SendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...

    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return SendResult(f"{self._prefix}{int(self._phys_offsets[index]):016X}", self._topic,
                          int(self._queue_ids[index]), int(self._queue_offsets[index]), self._broker)

    def __iter__(self) -> Iterator[SendResult]:
        prefix, topic, broker = self._prefix, self._topic, self._broker
        for queue_id, offset, phys in zip(self._queue_ids.tolist(), self._queue_offsets.tolist(),
                                          self._phys_offsets.tolist(), strict=True):
            yield SendResult(f"{prefix}{phys:016X}", topic, queue_id, offset, broker)

    def take(self, order: np.ndarray) -> SendResults:
        """These results rearranged: result ``i`` of the new sequence is ``self[order[i]]``."""
        return SendResults(self._topic, self._broker, self._prefix, self._queue_ids[order],
                           self._queue_offsets[order], self._phys_offsets[order])

    def __repr__(self) -> str:
        return f"SendResults({len(self)} results of {self._topic!r} on {self._broker})"


class ReceivedMessage:
    """One consumed message: a read-only view of a stored record in a fetched buffer."""

    __slots__ = ("_buf", "_msg_id_prefix", "_pos")

    def __init__(self, buf: memoryview, pos: int, msg_id_prefix: str) -> None:
        self._buf = buf
        self._pos = pos
        self._msg_id_prefix = msg_id_prefix  # hex of broker host and port, see :func:`msg_id_prefix`

    def _variable(self, index: int) -> memoryview:
        """Field ``index`` of the variable part: 0 topic, 1 tag, 2 born host, 3 keys, 4 props, 5 body."""
        body_len, *lengths = _LENGTHS.unpack_from(self._buf, self._pos + _OFF_LENGTHS)
        lengths.append(body_len)
        start = self._pos + HEADER_SIZE + sum(lengths[:index])
        return self._buf[start: start + lengths[index]]

    @property
    def topic(self) -> str:
        return bytes(self._variable(0)).decode()

    @property
    def queue_id(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + OFF_QUEUE_ID)[0]

    @property
    def queue_offset(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + OFF_QUEUE_OFFSET)[0]

    @property
    def phys_offset(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + OFF_PHYS_OFFSET)[0]

    @property
    def tag(self) -> str | None:
        return bytes(self._variable(1)).decode() or None

    @property
    def born_host(self) -> str:
        return bytes(self._variable(2)).decode()

    @property
    def keys(self) -> tuple[str, ...]:
        return decode_keys(self._variable(3))

    @property
    def properties(self) -> Mapping[str, str]:
        return decode_properties(self._variable(4))

    @property
    def body(self) -> bytes:
        return bytes(self._variable(5))

    @property
    def born_timestamp_ms(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + _OFF_BORN_TS)[0]

    @property
    def store_timestamp_ms(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + OFF_STORE_TS)[0]

    @property
    def reconsume_times(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + _OFF_RECONSUME)[0]

    @property
    def msg_id(self) -> str:
        return f"{self._msg_id_prefix}{self.phys_offset:016X}"

    def record(self) -> Record:
        """Every field of the stored record, decoded at once."""
        return decode_record(self._buf, self._pos, verify_crc=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return self.msg_id == other.msg_id

    def __hash__(self) -> int:
        return hash(self.msg_id)

    def __repr__(self) -> str:
        return (f"ReceivedMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, tag={self.tag!r}, msg_id={self.msg_id!r}, "
                f"body={len(self._variable(5))} bytes)")


class ReceivedMessages(_ListLike, Sequence[ReceivedMessage]):
    """Consumed messages in order, as record positions in fetched buffers, made on access.

    Each part is one fetched buffer with the start positions (int64 array) of its messages;
    iterating makes one :class:`ReceivedMessage` per message in C-level ``map``, and ``len``,
    splitting and joining never touch a message. Compares equal to, and concatenates with, lists.
    """

    __slots__ = ("_ends", "_parts")

    def __init__(self, parts: Sequence[tuple[memoryview, np.ndarray, str]] = ()) -> None:
        self._parts = [part for part in parts if len(part[1])]
        self._ends = list(accumulate(len(starts) for _, starts, _ in self._parts))

    @classmethod
    def concat(cls, sequences: Sequence[ReceivedMessages]) -> ReceivedMessages:
        return cls([part for seq in sequences for part in seq._parts])

    def split(self, count: int) -> tuple[ReceivedMessages, ReceivedMessages]:
        """The first ``count`` messages and the rest, without making any message."""
        head: list[tuple[memoryview, np.ndarray, str]] = []
        tail: list[tuple[memoryview, np.ndarray, str]] = []
        for (buf, starts, prefix), end in zip(self._parts, self._ends, strict=True):
            cut = min(max(count - (end - len(starts)), 0), len(starts))
            head.append((buf, starts[:cut], prefix))
            tail.append((buf, starts[cut:], prefix))
        return ReceivedMessages(head), ReceivedMessages(tail)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> ReceivedMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[ReceivedMessage]: ...

    def __getitem__(self, index: int | slice) -> ReceivedMessage | list[ReceivedMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if not -size <= index < size:
            raise IndexError("message index out of range")
        index %= size
        part = bisect_right(self._ends, index)
        buf, starts, prefix = self._parts[part]
        return ReceivedMessage(buf, int(starts[index - self._ends[part] + len(starts)]), prefix)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return chain.from_iterable(map(ReceivedMessage, repeat(buf), starts.tolist(), repeat(prefix))
                                   for buf, starts, prefix in self._parts)

    def __repr__(self) -> str:
        return f"ReceivedMessages({len(self)} messages)"
