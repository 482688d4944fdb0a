"""Reading request fields with clear errors: every handler validates its input here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np

from gms.errors import BadRequestError

T = TypeVar("T")
_MISSING = object()

# Arrays of ints travel as msgpack bin of big-endian numpy arrays (no per-item msgpack work).
QUEUE_ID_ARRAY = np.dtype(">i4")
OFFSET_ARRAY = np.dtype(">i8")


def field(fields: Mapping[str, Any], name: str, kind: type[T], default: Any = _MISSING) -> T:
    """``fields[name]`` checked to be a ``kind``; BadRequestError names the problem."""
    value = fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise BadRequestError(f"request field {name!r} is required")
        return default
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
