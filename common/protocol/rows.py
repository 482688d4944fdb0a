"""Positional rows on the wire: one schema per kind of row, with its encoder and decoder.

Requests and answers carry lists of queues as msgpack arrays (``[topic, queue_id, ...]``), not
maps: a fetch names thousands of queues and the keys would outweigh the values. The position of
each value is the row's schema, and it lives here, once: a row kind is a frozen dataclass deriving
from :class:`WireRow`, its fields in wire order, each declared with :func:`column` (its wire kind
and what it means). ``to_wire()`` gives the list to send, ``from_wire()`` checks a received list
and gives the row; nobody else indexes a row by position. docs/protocol.md's row tables are
generated from the same declarations (``python -m gms.protocol.docs``).

Rows grow at their end only, so peers of different versions understand each other:

- a column added later has a default: a row from an older peer, without it, decodes with that
  default (``optional``); columns are never removed or reordered;
- a ``trailing`` column is left off the wire while it holds its default (with every column after
  it), as the rows were written before it existed;
- an ``open`` row kind (an answer) ignores columns after those it knows: a newer peer's additions.

A row that does not fit raises :class:`~gms.errors.BadRequestError` naming the field and the
columns, or the column whose integer is out of its width.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

from gms.errors import BadRequestError
from gms.protocol.fields import INT32, INT64, IntWidth, checked_int

_REQUIRED: Any = dataclasses.MISSING
R = TypeVar("R", bound="WireRow")


class _Mismatch(Exception):
    """A value that is not of its column's kind (turned into the row's BadRequestError)."""


class Kind(NamedTuple):
    """What a column holds on the wire: its name in the docs and how a received value is read."""

    name: str
    decode: Callable[[str, Any], Any]  # (label for errors, wire value) -> value
    encode: Callable[[Any], Any] | None = None  # value -> wire value (None: as it is)


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


def rows_of(row: type[WireRow]) -> Kind:
    """An array of nested rows of another schema (``[[epoch, start_offset], ...]``)."""
    def decode(label: str, value: Any) -> tuple[WireRow, ...]:
        if not isinstance(value, list):
            raise _Mismatch
        return tuple(row.from_wire(v, label) for v in value)
    return Kind(f"[{row.__name__}, ...]", decode, lambda rows: [r.to_wire() for r in rows])


class Column(NamedTuple):
    name: str
    kind: Kind
    doc: str
    default: Any  # _REQUIRED: every row has it
    trailing: bool


def column(kind: Kind, doc: str, *, default: Any = _REQUIRED, trailing: bool = False) -> Any:
    """A row's field: its wire ``kind``, what it means (``doc``, for docs/protocol.md), the
    ``default`` a row without it decodes with (a column added after the first version), and
    whether it is ``trailing`` (left off the wire while it holds its default)."""
    if trailing and default is _REQUIRED:
        raise TypeError("a trailing column needs a default")
    metadata = {"kind": kind, "doc": doc, "trailing": trailing}
    return dataclasses.field(default=default, metadata=metadata)


class Schema:
    """The columns of one row kind, in wire order, and their encoder and decoder (what they need
    per row worked out once: a fetch answers thousands of rows)."""

    __slots__ = ("_decoders", "_encoders", "_labels", "_tail", "columns", "name", "open", "required")

    def __init__(self, name: str, columns: Sequence[Column], *, open: bool = False) -> None:
        self.name = name
        self.columns = tuple(columns)
        self.required = sum(1 for c in self.columns if c.default is _REQUIRED)
        if any(c.default is _REQUIRED for c in self.columns[self.required:]):
            raise TypeError(f"{name}: a column without a default follows one with a default")
        self.open = open  # columns after the known ones are ignored
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

    def decode(self, row: Any, field: str) -> list[Any]:
        """The values of the wire row ``row`` (an element of the request field ``field``),
        defaults filled in; BadRequestError when it does not fit."""
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
        return values

    def encode(self, values: Sequence[Any]) -> list[Any]:
        """The wire row of ``values`` (one per column), trailing defaults left off."""
        row = list(values)
        for i, encode in self._encoders:
            row[i] = encode(row[i])
        end = len(row)
        while end > self._tail and _is_default(values[end - 1], self.columns[end - 1].default):
            end -= 1
        if end < len(row):
            del row[end:]
        return row


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, tuple) and not default:  # an empty list of rows, however it was built
        return isinstance(value, (list, tuple)) and not value
    return bool(value is default or value == default)


def schema(name: str, columns: Sequence[Column], *, open: bool = False) -> Schema:
    """The schema of a row kind that is not a :class:`WireRow` (e.g. a NamedTuple kept for its callers)."""
    return Schema(name, columns, open=open)


def col(name: str, kind: Kind, doc: str, *, default: Any = _REQUIRED, trailing: bool = False) -> Column:
    """A :class:`Column` of a :func:`schema` declared by hand."""
    return Column(name, kind, doc, default, trailing)


class WireRow:
    """Base of the row dataclasses: ``@dataclass(frozen=True, slots=True)`` subclasses whose
    fields are declared with :func:`column`, in wire order."""

    __slots__ = ()
    OPEN: ClassVar[bool] = False  # an answer row: a newer peer's extra columns are ignored

    @classmethod
    def schema(cls) -> Schema:
        return _schema_of(cls)

    @classmethod
    def from_wire(cls, row: Any, field: str = "row") -> Self:
        """The row decoded from the wire list ``row`` (an element of the field ``field``)."""
        return cls(*_schema_of(cls).decode(row, field))

    def to_wire(self) -> list[Any]:
        found = _SCHEMAS.get(type(self)) or _schema_of(type(self))
        return found.encode(_getters[type(self)](self))


_SCHEMAS: dict[type[WireRow], Schema] = {}
_getters: dict[type[WireRow], Callable[[WireRow], tuple[Any, ...]]] = {}  # a row's values, in column order


def _schema_of(cls: type[WireRow]) -> Schema:
    found = _SCHEMAS.get(cls)
    if found is None:
        columns = [Column(f.name, f.metadata["kind"], f.metadata["doc"], f.default, f.metadata["trailing"])
                   for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        found = _SCHEMAS[cls] = Schema(cls.__name__, columns, open=cls.OPEN)
        names = [c.name for c in columns]
        getter = operator.attrgetter(*names)
        _getters[cls] = getter if len(names) > 1 else lambda row: (getter(row),)
    return found


def decode_rows(row: type[R], value: Any, field: str) -> list[R]:
    """The rows of the list field ``field`` (BadRequestError if it is not a list of such rows)."""
    if not isinstance(value, list):
        raise BadRequestError(f"request field {field!r} must be a list of {row.schema().shape()}")
    return [row.from_wire(r, field) for r in value]
