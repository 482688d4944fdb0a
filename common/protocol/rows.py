"""Positional rows on the wire: one schema per kind of row, with its encoder and decoder.

Requests and answers carry lists of queues as msgpack arrays (``[topic, queue_id, ...]``), not
maps: a fetch names thousands of queues and the keys would outweigh the values. The position of
each value is the row's schema, and it lives here, once: a row kind is a NamedTuple (immutable,
built and packed at C speed: a replication fetch has a row per followed queue) whose fields are
the columns in wire order, registered with :func:`wire_row` along with each column's wire kind and
meaning. :func:`encode` gives the list to send, :func:`decode` checks a received list and gives
the row; nobody else indexes a row by position. docs/protocol.md's row tables are generated from
the same declarations (``python -m gms.protocol.docs``).

Rows grow at their end only, so peers of different versions understand each other:

- a column added later has a default (the NamedTuple field's): a row from an older peer, without
  it, decodes with that default; columns are never removed or reordered;
- a ``trailing`` column is left off the wire while it holds its default (with every column after
  it), as the rows were written before it existed;
- an ``open`` row kind (an answer) ignores columns after those it knows: a newer peer's additions.

A row that does not fit raises :class:`~gms.errors.BadRequestError` naming the field and the
columns, or the column whose integer is out of its width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from gms.errors import BadRequestError
from gms.protocol.fields import INT32, INT64, IntWidth, checked_int, field

T = TypeVar("T", bound=tuple)  # a NamedTuple row kind
_NO_DEFAULT: Any = object()


class _Mismatch(Exception):
    """A value that is not of its column's kind (turned into the row's BadRequestError)."""


class Kind(NamedTuple):
    """What a column holds on the wire: its name in the docs and how a received value is read
    (``decode(label, value)``, the label naming the column in errors)."""

    name: str
    decode: Callable[[str, Any], Any]
    encode: Callable[[Any], Any] | None = None  # a non-empty value -> its wire form (None: as it is)


def _int_kind(width: IntWidth) -> Kind:
    low, high = width.low, width.high

    def decode(label: str, value: Any) -> int:
        if type(value) is int and low <= value <= high:
            return value
        return checked_int(label, value, width)  # raises, naming the column
    return Kind(width.name, decode)


def _typed(name: str, types: type | tuple[type, ...]) -> Kind:
    def decode(label: str, value: Any) -> Any:
        if not isinstance(value, types):
            raise _Mismatch
        return value
    return Kind(name, decode)


I32 = _int_kind(INT32)
I64 = _int_kind(INT64)
STR = _typed("str", str)
BIN = _typed("bin", (bytes, bytearray, memoryview))
ARRAY = _typed("array", list)  # an array the row leaves to its user (documented in the column)


def list_of(kind: Kind) -> Kind:
    """An array of values of one kind (``[offset, ...]``)."""
    def decode(label: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _Mismatch
        return [kind.decode(label, v) for v in value]
    return Kind(f"[{kind.name}, ...]", decode)


def rows_of(row: type[tuple]) -> Kind:
    """An array of nested rows of another kind (``[[epoch, start_offset], ...]``), decoded into a
    tuple of them (packed as they are: msgpack writes a tuple as an array)."""
    def decode(label: str, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _Mismatch
        return tuple(_SCHEMAS[row].decode(v, label) for v in value) if value else ()

    def encode(rows: Sequence[tuple]) -> tuple[tuple, ...]:  # their trailing defaults left off too
        return tuple(map(_SCHEMAS[row].encode, rows))
    return Kind(f"[{row.__name__}, ...]", decode, encode)


class Column(NamedTuple):
    name: str
    kind: Kind
    doc: str
    default: Any  # _NO_DEFAULT: every row has it
    trailing: bool


class Col(NamedTuple):
    """A column as :func:`wire_row` takes it: its kind, its meaning (for docs/protocol.md), and
    whether it is left off the wire while it holds its default."""

    kind: Kind
    doc: str
    trailing: bool = False


def col(kind: Kind, doc: str, *, trailing: bool = False) -> Col:
    return Col(kind, doc, trailing)


# The columns most queue rows open with.
TOPIC = col(STR, "the queue's topic")
QUEUE_ID = col(I32, "the queue")


class Schema:
    """The columns of one row kind, in wire order, with its encoder and decoder (what they need
    per row worked out once)."""

    __slots__ = ("_decoders", "_encoders", "_labels", "_make", "_tail", "columns", "name", "open", "required")

    def __init__(self, row: type[tuple], columns: Sequence[Column], *, open: bool) -> None:
        self.name = row.__name__
        self.columns = tuple(columns)
        self.required = sum(1 for c in self.columns if c.default is _NO_DEFAULT)
        self.open = open  # columns after the known ones are ignored
        self._make: Callable[[Sequence[Any]], Any] = row._make  # type: ignore[attr-defined]
        self._decoders = tuple(c.kind.decode for c in self.columns)
        self._encoders = tuple((i, c.kind.encode) for i, c in enumerate(self.columns) if c.kind.encode is not None)
        tail = len(self.columns)
        while tail and self.columns[tail - 1].trailing:
            tail -= 1
        self._tail = tail  # the columns from here on are trailing
        self._labels: dict[str, tuple[str, ...]] = {}  # field -> each column's name in errors

    def shape(self) -> str:
        """``[topic, queue_id, ...]``, as error messages and the docs show a row."""
        return "[" + ", ".join(c.name for c in self.columns) + "]"

    def decode(self, row: Any, field: str) -> Any:
        """The row of the wire list ``row`` (an element of the field ``field``), defaults filled
        in; BadRequestError when it does not fit."""
        n = len(self.columns)
        if type(row) is not list or len(row) < self.required or (len(row) > n and not self.open):
            raise BadRequestError(f"request field {field!r} must hold rows of {self.shape()}")
        labels = self._labels.get(field)
        if labels is None:
            labels = self._labels[field] = tuple(f"{field}: {c.name}" for c in self.columns)
        try:
            values = [decode(label, v) for decode, label, v in zip(self._decoders, labels, row, strict=False)]
        except _Mismatch:
            raise BadRequestError(f"request field {field!r} must hold rows of {self.shape()}") from None
        if len(values) < n:
            values.extend(c.default for c in self.columns[len(values):])
        return self._make(values)

    def encode(self, row: tuple) -> tuple:
        """The wire form of ``row``: itself (msgpack writes a tuple as an array), its trailing
        defaults left off, and those of its nested rows."""
        end = len(row)
        while end > self._tail and _is_default(row[end - 1], self.columns[end - 1].default):
            end -= 1
        wire = row if end == len(row) else row[:end]
        if any(row[i] for i, _ in self._encoders):
            values = list(wire)
            for i, nested in self._encoders:
                if i < end and values[i]:
                    values[i] = nested(values[i])
            wire = tuple(values)
        return wire


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, tuple) and not default:  # an empty list of rows, however it was built
        return isinstance(value, (list, tuple)) and not value
    return bool(value is default or value == default)


_SCHEMAS: dict[type, Schema] = {}


def wire_row(row: type[T], *, open: bool = False, required: int | None = None, **columns: Col) -> Schema:
    """Register the NamedTuple ``row`` as a row kind whose columns are its fields, described by
    ``columns`` (one per field, in field order); the fields' defaults are the defaults of columns
    added later, unless ``required`` says how many columns every row has. ``open``: an answer
    row, whose extra columns (a newer peer's) are ignored."""
    fields: tuple[str, ...] = row._fields  # type: ignore[attr-defined]
    if tuple(columns) != fields:
        raise TypeError(f"{row.__name__}: columns {tuple(columns)} are not its fields {fields}")
    defaults: dict[str, Any] = row._field_defaults  # type: ignore[attr-defined]
    described = [Column(name, c.kind, c.doc, _NO_DEFAULT if required is not None and i < required
                        else defaults.get(name, _NO_DEFAULT), c.trailing)
                 for i, (name, c) in enumerate(columns.items())]
    if any(c.trailing and c.default is _NO_DEFAULT for c in described):
        raise TypeError(f"{row.__name__}: a trailing column needs a default")
    found = _SCHEMAS[row] = Schema(row, described, open=open)
    return found


def schema_of(row: type[tuple]) -> Schema:
    return _SCHEMAS[row]


def encode(row: tuple) -> tuple:
    """The wire form of a registered row (a tuple: msgpack writes it as an array)."""
    return _SCHEMAS[type(row)].encode(row)


def decode(row: type[T], value: Any, field: str = "row") -> T:
    """The ``row`` decoded from the wire list ``value`` (an element of the field ``field``)."""
    decoded: T = _SCHEMAS[row].decode(value, field)
    return decoded


def decode_rows(row: type[T], value: Any, field: str) -> list[T]:
    """The rows of the list field ``field`` (BadRequestError if it is not a list of such rows)."""
    if not isinstance(value, list):
        raise BadRequestError(f"request field {field!r} must be a list of {_SCHEMAS[row].shape()}")
    found = _SCHEMAS[row]
    return [found.decode(r, field) for r in value]


def rows_field(fields: Mapping[str, Any], name: str, row: type[T]) -> list[T]:
    """The ``row`` rows of the required list field ``name`` (BadRequestError names a bad one)."""
    return decode_rows(row, field(fields, name, list), name)
