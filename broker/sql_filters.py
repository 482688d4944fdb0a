"""Broker-side SQL92 filtering of a pull's records: the records read are decoded as property
columns (in C, from the records where they are stored) and the subscription's expression
(:mod:`gms.sql92`) keeps the ones it selects, so the others never cross the network."""

from __future__ import annotations

import functools

import numpy as np

from gms.broker.store import RecordSelector
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


def selected_at(sql: SqlFilter, buf: memoryview | bytes, starts: np.ndarray) -> np.ndarray:
    """A boolean mask over the records at ``starts`` of ``buf``: those ``sql`` selects. Every
    header is checked first (CorruptRecord names the first inconsistent one)."""
    if not len(starts):
        return np.zeros(0, bool)
    columns = property_columns(buf, read_field_offsets(buf, starts), sql.names)
    return sql.select(columns, len(starts))


def selector(sql: SqlFilter) -> RecordSelector:
    """``sql`` as the store's ``get`` applies it to the records it reads."""
    return functools.partial(selected_at, sql)
