"""Broker-side SQL92 filtering of a pull's records: the window the tag filter let through is
read as property columns and the subscription's expression (:mod:`gms.sql92`) keeps the records
it selects, so the others never cross the network."""

from __future__ import annotations

import functools

import numpy as np

from gms.errors import BadTagExpressionError
from gms.record.columns import property_columns, read_field_offsets
from gms.sql92 import BadFilterExpression, SqlFilter, compile_filter

COMPILED_KEPT = 256  # distinct expressions kept compiled (one per subscription, in practice)


@functools.lru_cache(maxsize=COMPILED_KEPT)
def _compiled(expression: str) -> SqlFilter:
    return compile_filter(expression)


def sql_filter(expression: str) -> SqlFilter:
    """The compiled expression; BadTagExpressionError (the subscription's filter) naming the
    position when it does not parse."""
    try:
        return _compiled(expression)
    except BadFilterExpression as err:
        raise BadTagExpressionError(str(err)) from err


def selected(sql: SqlFilter, records: list[memoryview]) -> np.ndarray:
    """A boolean mask over ``records`` (one stored record each): those ``sql`` selects."""
    if not records:
        return np.zeros(0, bool)
    lengths = np.fromiter(map(len, records), np.int64, len(records))
    starts = np.concatenate(([0], np.cumsum(lengths[:-1])))
    joined = b"".join(records)
    columns = property_columns(joined, read_field_offsets(joined, starts), sql.names)
    return sql.select(columns, len(records))
