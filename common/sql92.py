"""RocketMQ's SQL92 subset for property filters, parsed once and evaluated over whole batches.

An expression such as ``region = 'eu' AND amount BETWEEN 10 AND 100 AND TAGS IN ('a', 'b')``
compiles (:func:`compile_filter`) into a :class:`SqlFilter`: the property names it reads
(``TAGS`` is the message's tag) and an evaluator over *columns* -- one numpy object array per
property, a value per message (``None`` where a message lacks it). Evaluation is numpy work per
comparison, not Python work per message, so a broker can filter a pull's window of thousands of
records in one go.

Semantics (RocketMQ's): property values are strings; a numeric comparison (``>``, ``>=``, ``<``,
``<=``, ``BETWEEN``, ``=``/``<>`` with a number) reads them as numbers, and a value that is not
a number makes it unknown; ``=``/``<>``/``IN`` with strings compare text. A missing property is
NULL: every comparison with it is unknown, ``IS NULL`` is true. ``AND``/``OR``/``NOT`` follow
SQL's three-valued logic, and a message is selected only when the whole expression is TRUE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from lark import Lark, Token, Transformer, UnexpectedInput, v_args
from lark.exceptions import VisitError

# Three-valued logic as int8: AND is the minimum, OR the maximum, NOT the negation.
TRUE, UNKNOWN, FALSE = np.int8(1), np.int8(0), np.int8(-1)
TAGS = "TAGS"
EXPRESSION_LENGTH_MAX = 4096

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*                     -> any_of
?and_expr: not_expr (_AND not_expr)*                   -> all_of
?not_expr: NOT not_expr                                -> negate
         | predicate
         | "(" or_expr ")"
?predicate: name COMPARATOR literal                    -> compare
          | name NOT? _BETWEEN number _AND number      -> between
          | name NOT? _IN "(" literal ("," literal)* ")" -> within
          | name _IS NOT? _NULL                        -> is_null
          | boolean                                    -> constant
name: NAME
?literal: STRING                                       -> string
        | SIGNED_NUMBER                                -> number
        | boolean
number: SIGNED_NUMBER
boolean: _TRUE                                         -> true
       | _FALSE                                        -> false
COMPARATOR: "<>" | "<=" | ">=" | "=" | "<" | ">"
STRING: /'([^']|'')*'/
NAME.0: /(?!(?i:and|or|not|between|in|is|null|true|false)\b)[A-Za-z_][A-Za-z0-9_.\-]*/
NOT.1: /not\b/i
_OR.1: /or\b/i
_AND.1: /and\b/i
_BETWEEN.1: /between\b/i
_IN.1: /in\b/i
_IS.1: /is\b/i
_NULL.1: /null\b/i
_TRUE.1: /true\b/i
_FALSE.1: /false\b/i
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False)

Columns = dict[str, np.ndarray]  # property name -> object array of str | None, one per message
Evaluator = Callable[[Columns, int], np.ndarray]  # (columns, message count) -> int8 truth values


class BadFilterExpression(ValueError):
    """An expression that does not parse; the message names the position (1-based column)."""


@dataclass(frozen=True, slots=True)
class SqlFilter:
    expression: str
    names: frozenset[str]  # the properties it reads (TAGS: the message's tag)
    _evaluate: Evaluator

    def select(self, columns: Columns, count: int) -> np.ndarray:
        """A boolean mask of the ``count`` messages the expression selects (TRUE, not unknown)."""
        return self._evaluate(columns, count) == TRUE


def compile_filter(expression: str) -> SqlFilter:
    if len(expression) > EXPRESSION_LENGTH_MAX:
        raise BadFilterExpression(f"a filter expression is at most {EXPRESSION_LENGTH_MAX} characters")
    if not expression.strip():
        raise BadFilterExpression("the filter expression is empty")
    try:
        tree = _PARSER.parse(expression)
    except UnexpectedInput as err:
        near = expression[max(err.column - 1, 0): err.column + 15] if err.column > 0 else ""
        raise BadFilterExpression(
            f"bad filter expression at position {err.column}"
            + (f" (near {near!r})" if near else "") + f": {expression!r}") from None
    compiler = _Compiler()
    try:
        evaluate = compiler.transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, BadFilterExpression):
            raise BadFilterExpression(f"{err.orig_exc}: {expression!r}") from None
        raise
    return SqlFilter(expression, frozenset(compiler.names), evaluate)


# --- evaluation helpers (vectorised over one column) ------------------------------------------

def _truth(holds: np.ndarray, known: np.ndarray) -> np.ndarray:
    return np.where(known, np.where(holds, TRUE, FALSE), UNKNOWN).astype(np.int8)


def _numbers(column: np.ndarray) -> np.ndarray:
    """The column read as float64; NaN where missing or not a number."""
    try:
        return np.where(column == None, np.nan, column).astype(np.float64)  # noqa: E711 - elementwise
    except (TypeError, ValueError):
        out = np.full(len(column), np.nan)
        for i, value in enumerate(column):
            if value is not None:
                try:
                    out[i] = float(value)
                except ValueError:
                    pass
        return out


def _column(columns: Columns, name: str, count: int) -> np.ndarray:
    column = columns.get(name)
    return np.full(count, None, dtype=object) if column is None else column


class _Compiler(Transformer[Token, Any]):
    """Parse tree -> evaluator closures; collects the property names read."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    # literals
    def string(self, items: Sequence[Token]) -> str:
        return str(items[0])[1:-1].replace("''", "'")

    def number(self, items: Sequence[Token]) -> float:
        return float(items[0])

    def true(self, items: Sequence[Token]) -> bool:
        return True

    def false(self, items: Sequence[Token]) -> bool:
        return False

    def name(self, items: Sequence[Token]) -> str:
        name = str(items[0])
        self.names.add(name)
        return name

    # predicates
    @v_args(inline=True)
    def compare(self, name: str, operator: Token, value: Any) -> Evaluator:
        position, op = operator.column, str(operator)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if isinstance(value, float):
            compare = _NUMERIC[op]

            def numeric(columns: Columns, count: int) -> np.ndarray:
                numbers = _numbers(_column(columns, name, count))
                known = ~np.isnan(numbers)
                with np.errstate(invalid="ignore"):
                    return _truth(compare(numbers, value), known)
            return numeric
        if op not in ("=", "<>"):
            raise BadFilterExpression(f"bad filter expression at position {position}: {name} {op} '{value}'"
                                      " (strings compare only with = and <>)")
        equal = op == "="

        def text(columns: Columns, count: int) -> np.ndarray:
            column = _column(columns, name, count)
            known = column != None  # noqa: E711 - elementwise
            holds = column == value
            return _truth(holds if equal else ~holds, known)
        return text

    def between(self, items: Sequence[Any]) -> Evaluator:
        name, low, high = items[0], items[-2], items[-1]
        negated = _has_not(items)

        def evaluate(columns: Columns, count: int) -> np.ndarray:
            numbers = _numbers(_column(columns, name, count))
            known = ~np.isnan(numbers)
            with np.errstate(invalid="ignore"):
                holds = (numbers >= low) & (numbers <= high)
            return _truth(~holds if negated else holds, known)
        return evaluate

    def within(self, items: Sequence[Any]) -> Evaluator:
        name, negated = items[0], _has_not(items)
        values = [v for v in items[1:] if not isinstance(v, Token)]
        texts = {("true" if v else "false") if isinstance(v, bool) else
                 (_number_text(v) if isinstance(v, float) else v) for v in values}

        def evaluate(columns: Columns, count: int) -> np.ndarray:
            column = _column(columns, name, count)
            known = column != None  # noqa: E711 - elementwise
            holds = np.isin(column, list(texts))
            return _truth(~holds if negated else holds, known)
        return evaluate

    def is_null(self, items: Sequence[Any]) -> Evaluator:
        name, negated = items[0], _has_not(items)

        def evaluate(columns: Columns, count: int) -> np.ndarray:
            missing = _column(columns, name, count) == None  # noqa: E711 - elementwise
            holds = ~missing if negated else missing
            return np.where(holds, TRUE, FALSE).astype(np.int8)
        return evaluate

    def constant(self, items: Sequence[bool]) -> Evaluator:
        value = TRUE if items[0] else FALSE
        return lambda columns, count: np.full(count, value, np.int8)

    # logic
    def negate(self, items: Sequence[Any]) -> Evaluator:
        inner = items[1]
        return lambda columns, count: -inner(columns, count)

    def all_of(self, items: Sequence[Evaluator]) -> Evaluator:
        return lambda columns, count: np.minimum.reduce([e(columns, count) for e in items])

    def any_of(self, items: Sequence[Evaluator]) -> Evaluator:
        return lambda columns, count: np.maximum.reduce([e(columns, count) for e in items])


def _has_not(items: Sequence[Any]) -> bool:
    return any(isinstance(item, Token) and item.type == "NOT" for item in items)

_NUMERIC: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "=": np.equal, "<>": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
}


def _number_text(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)
