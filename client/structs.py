"""Public values of the SDK: what a send returns and what a consumer receives.

A consumer may hand out a million messages a second, so what ``poll`` returns is
:class:`ReceivedMessages`: ranges of :class:`MessageBatch` es (one per fetched response), whose
common fields are decoded for the whole response at once, column by column, when a message is
first asked for; a :class:`ReceivedMessage` is a tuple made in C from its row, and its rarer
fields are decoded from the record on access (the layout is :mod:`gms.record`'s).
"""

from __future__ import annotations

import collections
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import accumulate, chain
from operator import getitem, itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple, cast, overload

import numpy as np

from gms.client._rows import make_rows
from gms.client.send_results import _ListLike
from gms.errors import GmsError
from gms.record import (
    HEADER_SIZE,
    OFF_PHYS_OFFSET,
    OFF_STORE_TS,
    OFFSETS,
    UNDECODABLE,
    FieldOffsets,
    Record,
    decode_keys,
    decode_properties,
    decode_record,
    keys_column,
    read_field_offsets,
    text_column,
)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# body_len .. props_len: the lengths that locate the variable part.
_LENGTHS = struct.Struct(">iBBBxHH")
_OFF_LENGTHS = OFFSETS["body_len"]
_OFF_BORN_TS = OFFSETS["born_ts_ms"]
_OFF_RECONSUME = OFFSETS["reconsume_times"]


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


def _field(index: int, doc: str) -> Any:
    """A read-only attribute that is item ``index`` of the tuple (a C descriptor, as namedtuple's)."""
    getter = getattr(collections, "_tuplegetter", None)
    return getter(index, doc) if getter is not None else property(itemgetter(index), doc=doc)


class ReceivedMessage(tuple[Any, ...]):
    """One consumed message.

    Messages are made by the thousand, so a message is a tuple made in C (see
    :class:`MessageBatch`) holding what nearly every consumer reads — topic, tag, keys, body,
    queue id and offset — read through C descriptors; the other fields (born host,
    properties, timestamps, message id) are decoded from the stored record on access.
    ``ReceivedMessage(buf, pos, msg_id_prefix)`` is the message of the record at ``pos``."""

    __slots__ = ()

    # Items: topic, tag, keys, body, queue_id, queue_offset, index in the batch, MessageBatch.
    if TYPE_CHECKING:
        @property
        def topic(self) -> str: ...

        @property
        def tag(self) -> str | None: ...

        @property
        def keys(self) -> tuple[str, ...]: ...

        @property
        def body(self) -> bytes: ...

        @property
        def queue_id(self) -> int: ...

        @property
        def queue_offset(self) -> int: ...
    else:
        topic = _field(0, "The topic the message was sent to.")
        tag = _field(1, "The message's tag, None without one.")
        keys = _field(2, "The message's keys (a tuple of str).")
        body = _field(3, "The message's body (bytes).")
        queue_id = _field(4, "The queue of the topic that stores the message.")
        queue_offset = _field(5, "The message's offset in its queue.")

    def __new__(cls, buf: bytes | memoryview, pos: int, msg_id_prefix: str) -> ReceivedMessage:
        return MessageBatch(memoryview(buf), np.array([pos], np.int64), msg_id_prefix)[0]

    @property
    def _pos(self) -> int:
        """Where the message's record starts in its batch's buffer."""
        return int(self[7].starts[self[6]])

    @property
    def raw_record(self) -> memoryview:
        """The stored record as it came over the wire (format v1: ``gms.record``), for tools that
        check or copy it whole."""
        pos = self._pos
        return self[7].buf[pos: pos + _I32.unpack_from(self[7].buf, pos)[0]]

    def _variable(self, index: int) -> memoryview:
        """Field ``index`` of the variable part: 0 topic, 1 tag, 2 born host, 3 keys, 4 props, 5 body."""
        return _variable(self[7].buf, self._pos, index)

    def _unpack(self, fmt: struct.Struct, offset: int) -> int:
        return cast(int, fmt.unpack_from(self[7].buf, self._pos + offset)[0])

    @property
    def phys_offset(self) -> int:
        return self._unpack(_I64, OFF_PHYS_OFFSET)

    @property
    def born_host(self) -> str:
        return bytes(self._variable(2)).decode()

    @property
    def properties(self) -> Mapping[str, str]:
        return decode_properties(self._variable(4))

    @property
    def born_timestamp_ms(self) -> int:
        return self._unpack(_I64, _OFF_BORN_TS)

    @property
    def store_timestamp_ms(self) -> int:
        return self._unpack(_I64, OFF_STORE_TS)

    @property
    def reconsume_times(self) -> int:
        return self._unpack(_I32, _OFF_RECONSUME)

    @property
    def msg_id(self) -> str:
        return f"{self[7].prefix}{self.phys_offset:016X}"

    def record(self) -> Record:
        """Every field of the stored record, decoded at once."""
        return decode_record(self[7].buf, self._pos, verify_crc=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return self.msg_id == other.msg_id

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.msg_id)

    def __reduce__(self) -> tuple[Any, ...]:  # copy.copy: the same items (not a pickle: the buffer is not)
        return tuple.__new__, (type(self), tuple(self))

    def __repr__(self) -> str:
        return (f"ReceivedMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, tag={self.tag!r}, msg_id={self.msg_id!r}, "
                f"body={len(self._variable(5))} bytes)")


class _UndecodableMessage(ReceivedMessage):
    """A message whose topic, tag or keys are not valid utf-8: they are decoded on access, which
    raises UnicodeDecodeError for the broken one (the others read as usual)."""

    __slots__ = ()

    if not TYPE_CHECKING:
        @property
        def topic(self) -> str:
            return bytes(self._variable(0)).decode()

        @property
        def tag(self) -> str | None:
            return bytes(self._variable(1)).decode() or None

        @property
        def keys(self) -> tuple[str, ...]:
            return decode_keys(self._variable(3))


def _variable(buf: memoryview, pos: int, index: int) -> memoryview:
    """Field ``index`` of the variable part of the record at ``pos``: 0 topic, 1 tag, 2 born
    host, 3 keys, 4 props, 5 body."""
    body_len, *lengths = _LENGTHS.unpack_from(buf, pos + _OFF_LENGTHS)
    lengths.append(body_len)
    start = pos + HEADER_SIZE + sum(lengths[:index])
    return buf[start: start + lengths[index]]


class _Same(NamedTuple):
    """A column whose every row holds ``value``."""

    value: Any


class _Slices(NamedTuple):
    """A column of bytes: row ``i`` is ``bytes(buf[at[i]: at[i] + size[i]])``, copied out when its
    message is made (int64 arrays)."""

    buf: memoryview
    at: np.ndarray
    size: np.ndarray


Column = Sequence[Any] | _Same | _Slices


class MessageBatch(Sequence[ReceivedMessage]):
    """The messages of one fetched buffer (a PULL response): the records at ``starts``.

    The first time a message is asked for, the fields every message carries are decoded for the
    whole batch at once, column by column, without a Python call per message: topics and tags
    once per distinct value (checked byte for byte against every record, numpy-vectorised),
    keys split by C-level ``map``; the messages are then made from the rows in one C call
    (:func:`gms.client._rows.make_rows`), each body copied out of the buffer as bytes."""

    __slots__ = ("_columns", "_topic_groups", "buf", "prefix", "starts")

    def __init__(self, buf: memoryview, starts: np.ndarray, prefix: str,
                 offsets: FieldOffsets | None = None, topic_groups: np.ndarray | None = None) -> None:
        """``offsets`` are the checked field offsets of the records (read here if not given:
        CorruptRecord if a header is inconsistent). ``topic_groups``: per record, a number shared
        by records likely of one topic (a FETCH answer's queue): the topics of an answer of
        thousands of topics are then decoded once per group and compared byte for byte, not
        decoded record by record."""
        self.buf = buf
        self.starts = starts
        self.prefix = prefix  # hex of broker host and port, see :func:`gms.client.connections.msg_id_prefix`
        self._topic_groups = topic_groups
        self._columns: list[Column] | FieldOffsets = (
            offsets if offsets is not None else read_field_offsets(buf, starts))

    def __len__(self) -> int:
        return len(self.starts)

    def columns(self) -> list[Column]:
        """The rows of the messages, column by column: topic, tag, keys, body, queue id, queue
        offset, index in the batch, batch, and the class of each message."""
        columns = self._columns
        if isinstance(columns, list):
            return columns
        buf, headers = self.buf, columns.headers
        topics = text_column(buf, columns.topic_at, headers["topic_len"], groups=self._topic_groups)
        tags = text_column(buf, columns.tag_at, headers["tag_len"], groups=headers["tag_hash"], empty=None)
        keys = keys_column(buf, columns.keys_at, headers["keys_len"])
        bodies = _Slices(buf, np.ascontiguousarray(columns.body_at, np.int64),
                         np.ascontiguousarray(headers["body_len"], np.int64))
        queue_ids = headers["queue_id"]
        texts = [_same(topics), _same(tags), _same(keys)]
        undecodable = any(c.value is UNDECODABLE if type(c) is _Same else UNDECODABLE in c for c in texts)
        made: list[Column] = [
            *texts, bodies,
            _Same(int(queue_ids[0])) if (queue_ids == queue_ids[0]).all() else queue_ids.tolist(),
            _int_column(headers["queue_offset"]), range(len(self.starts)), _Same(self),
            [_UndecodableMessage if UNDECODABLE in row else ReceivedMessage
             for row in zip(topics, tags, keys, strict=True)] if undecodable else _Same(ReceivedMessage),
        ]
        self._columns = made
        return made

    def iterate(self, start: int = 0, stop: int | None = None) -> Iterator[ReceivedMessage]:
        """Messages ``start`` to ``stop``, made in one C call (:func:`make_rows`)."""
        *fields, classes = self.columns()
        return iter(make_rows(classes, tuple(fields), start, len(self) if stop is None else stop))

    @overload
    def __getitem__(self, index: int) -> ReceivedMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[ReceivedMessage]: ...

    def __getitem__(self, index: int | slice) -> ReceivedMessage | list[ReceivedMessage]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return list(self.iterate(start, stop))[::step] if step > 0 else [self[i] for i in range(start, stop, step)]
        index = range(len(self))[index]
        return next(self.iterate(index, index + 1))

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return self.iterate()

    def queue_offset(self, index: int) -> int:
        """Message ``index``'s queue offset, without decoding the batch's columns (a poll that
        splits a batch asks for it while it holds the fetch buffer's lock)."""
        columns = self._columns
        if isinstance(columns, list):
            return cast(int, columns[5][index])
        return int(columns.headers["queue_offset"][index])


def _int_column(values: np.ndarray) -> Sequence[int]:
    """``values`` as Python ints: a range when they count up by one (queue offsets do)."""
    first = int(values[0])
    if int(values[-1]) - first == len(values) - 1 and (np.diff(values) == 1).all():
        return range(first, first + len(values))
    return cast(list[int], values.tolist())


def _same(column: list[Any]) -> Column:
    """``column`` as :class:`_Same` when one object fills it (as text columns of one value are)."""
    first = column[0]
    return _Same(first) if column.count(first) == len(column) else column


class ReceiptHandle(NamedTuple):
    """Which delivery of a popped message to acknowledge (RocketMQ 5's receipt handle): its
    queue and offset, and the delivery attempt (a handle of an earlier attempt no longer holds).
    ``str(handle)`` / :meth:`parse` give its text form, ``topic;queue_id;offset;attempt``."""

    topic: str
    queue_id: int
    offset: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.topic};{self.queue_id};{self.offset};{self.attempt}"

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        try:
            topic, queue_id, offset, attempt = text.split(";")
            return cls(topic, int(queue_id), int(offset), int(attempt))
        except ValueError:
            raise ValueError(f"not a receipt handle: {text!r} (expected topic;queue_id;offset;attempt)") from None


class PoppedMessage(ReceivedMessage):
    """A message handed out by pop consumption (:class:`gms.client.SimpleConsumer`): invisible to
    the group's other consumers until acknowledged or its invisible duration ends."""

    __slots__ = ()

    # Items: those of ReceivedMessage, then the delivery attempt.
    if TYPE_CHECKING:
        @property
        def delivery_attempt(self) -> int: ...
    else:
        delivery_attempt = _field(8, "How many times the message was handed out, this one included (1: the first).")

    @property
    def receipt_handle(self) -> ReceiptHandle:
        return ReceiptHandle(self.topic, self.queue_id, self.queue_offset, self.delivery_attempt)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, delivery_attempt={self.delivery_attempt})".replace(
            "ReceivedMessage(", "PoppedMessage(", 1)


class _UndecodablePoppedMessage(_UndecodableMessage, PoppedMessage):
    __slots__ = ()


class PopBatch(MessageBatch):
    """The messages of one POP_MESSAGE answer: a :class:`MessageBatch` of :class:`PoppedMessage`
    with each one's delivery attempt (``attempts`` of the first records, 1 for the rest)."""

    __slots__ = ("attempts",)

    def __init__(self, buf: memoryview, starts: np.ndarray, prefix: str, offsets: FieldOffsets | None,
                 attempts: Sequence[int]) -> None:
        super().__init__(buf, starts, prefix, offsets)
        self.attempts = attempts

    def columns(self) -> list[Column]:
        columns = self._columns
        if isinstance(columns, list) and len(columns) == _POPPED_COLUMNS:
            return columns
        *fields, classes = super().columns()
        attempts: Column = (list(self.attempts) + [1] * (len(self) - len(self.attempts)) if len(self.attempts)
                            else _Same(1))
        popped: Column = (_Same(_POPPED[classes.value]) if type(classes) is _Same
                          else [_POPPED[c] for c in cast(list[type[ReceivedMessage]], classes)])
        made = [*fields, attempts, popped]
        self._columns = made
        return made

    def handle_columns(self, start: int, stop: int) -> tuple[str | list[str], np.ndarray, np.ndarray, np.ndarray]:
        """The receipt handles of messages ``start`` to ``stop`` as columns, without making a
        message: their topic (one str when all share it), queue ids, offsets and attempts."""
        topics, _, _, _, queue_ids, offsets, *_, attempts, _ = self.columns()
        return (topics.value if type(topics) is _Same else list(topics[start:stop]),
                _int_array(queue_ids, start, stop), _int_array(offsets, start, stop),
                _int_array(attempts, start, stop))


_POPPED_COLUMNS = 10
_POPPED = {ReceivedMessage: PoppedMessage, _UndecodableMessage: _UndecodablePoppedMessage}


def _int_array(column: Column, start: int, stop: int) -> np.ndarray:
    if type(column) is _Same:
        return np.full(stop - start, column.value, np.int64)
    part = column[start:stop]
    if isinstance(part, range):
        return np.arange(part.start, part.stop, part.step, dtype=np.int64)
    return np.asarray(part, np.int64)


class ReceivedMessages(_ListLike, Sequence[ReceivedMessage]):
    """Consumed messages in order, as ranges of :class:`MessageBatch` es, made on access.

    Iterating makes each :class:`ReceivedMessage` in C; ``len``, splitting and joining never
    touch a message. Compares equal to, and concatenates with, lists.
    """

    __slots__ = ("_ends", "_parts")

    def __init__(self, parts: Sequence[MessageBatch | tuple[MessageBatch, int, int]] = ()) -> None:
        """``parts``: whole batches, or (batch, start, stop) ranges of them."""
        ranges = [(p, 0, len(p)) if isinstance(p, MessageBatch) else p for p in parts]
        self._parts = [r for r in ranges if r[2] > r[1]]
        self._ends = list(accumulate(stop - start for _, start, stop in self._parts))

    @classmethod
    def concat(cls, sequences: Sequence[ReceivedMessages]) -> ReceivedMessages:
        return cls([part for seq in sequences for part in seq._parts])

    def parts(self) -> list[tuple[MessageBatch, int, int]]:
        """The (batch, start, stop) ranges the messages are made of, in order."""
        return list(self._parts)

    def split(self, count: int) -> tuple[ReceivedMessages, ReceivedMessages]:
        """The first ``count`` messages and the rest, without making any message."""
        head: list[tuple[MessageBatch, int, int]] = []
        tail: list[tuple[MessageBatch, int, int]] = []
        for (batch, start, stop), end in zip(self._parts, self._ends, strict=True):
            cut = start + min(max(count - (end - (stop - start)), 0), stop - start)
            head.append((batch, start, cut))
            tail.append((batch, cut, stop))
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
        return cast(ReceivedMessage, self._at(index % size, getitem))

    def queue_offset(self, index: int) -> int:
        """Message ``index``'s queue offset (``self[index].queue_offset``) without making it."""
        return cast(int, self._at(range(len(self))[index], MessageBatch.queue_offset))

    def _at(self, index: int, get: Callable[[MessageBatch, int], Any]) -> Any:
        """``get(batch, i)`` for the batch and position in it of message ``index`` (0 <= index < len)."""
        part = bisect_right(self._ends, index)
        batch, start, stop = self._parts[part]
        return get(batch, start + index - (self._ends[part] - (stop - start)))

    def __iter__(self) -> Iterator[ReceivedMessage]:
        if len(self._parts) == 1:
            batch, start, stop = self._parts[0]
            return batch.iterate(start, stop)
        return chain.from_iterable(batch.iterate(start, stop) for batch, start, stop in self._parts)

    def __repr__(self) -> str:
        return f"ReceivedMessages({len(self)} messages)"
