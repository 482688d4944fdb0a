"""Reading request fields with clear errors: every handler validates its input here.

Integers that end up in a fixed-width slot (a ``struct`` field, a numpy array, a record header)
are read with their wire width (:data:`INT32`, :data:`INT64`) instead of ``int``: a value that
does not fit is the client's mistake and gets ``BAD_REQUEST`` naming the field, never a
``struct.error`` or ``OverflowError`` from deep inside the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar, overload

import numpy as np

from gms.errors import BadRequestError

T = TypeVar("T")
_MISSING: Any = object()

# Arrays of ints travel as msgpack bin of big-endian numpy arrays (no per-item msgpack work).
QUEUE_ID_ARRAY = np.dtype(">i4")
OFFSET_ARRAY = np.dtype(">i8")


class IntWidth(NamedTuple):
    """The integers a fixed-width signed slot holds."""

    name: str
    low: int
    high: int


INT32 = IntWidth("int32", -(1 << 31), (1 << 31) - 1)  # queue ids, counts, sizes
INT64 = IntWidth("int64", -(1 << 63), (1 << 63) - 1)  # offsets, timestamps


def checked_int(name: str, value: Any, width: IntWidth) -> int:
    """``value`` if it is an int (not a bool) that fits ``width``; BadRequestError names ``name``."""
    if type(value) is not int:
        raise BadRequestError(f"request field {name!r} must be int, not {type(value).__name__}")
    if not width.low <= value <= width.high:
        raise BadRequestError(
            f"request field {name!r} is {value}, outside {width.name} ({width.low}..{width.high})")
    return value


@overload
def field(fields: Mapping[str, Any], name: str, kind: IntWidth, default: Any = _MISSING) -> int: ...
@overload
def field(fields: Mapping[str, Any], name: str, kind: type[T], default: Any = _MISSING) -> T: ...
def field(fields: Mapping[str, Any], name: str, kind: Any, default: Any = _MISSING) -> Any:
    """``fields[name]`` checked to be a ``kind``: a type, or an :class:`IntWidth` for an integer
    that must fit that width (``int`` means :data:`INT64`); BadRequestError names the problem."""
    value = fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise BadRequestError(f"request field {name!r} is required")
        return default
    if type(kind) is IntWidth:
        return checked_int(name, value, kind)
    if kind is int:  # whatever it feeds, an int field never exceeds the widest slot
        return checked_int(name, value, INT64)
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise BadRequestError(
            f"request field {name!r} must be {kind.__name__}, not {type(value).__name__}"
        )
    return value


def int_array(values: np.ndarray, dtype: np.dtype) -> bytes:
    return np.asarray(values).astype(dtype, copy=False).tobytes()


def read_int_array(raw: bytes, dtype: np.dtype) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise BadRequestError(f"array of {dtype} has a length that is not a multiple of {dtype.itemsize}")
    return np.frombuffer(raw, dtype)
