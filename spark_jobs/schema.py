"""The DataFrame schema of a gms read, declared once as Spark DDL and as the matching Arrow types.

PySpark checks Arrow batches yielded by a Python data source against
``to_arrow_schema(schema, timezone="UTC")``: timestamps are microseconds in UTC, arrays are
lists, maps are maps of string to string.
"""

from __future__ import annotations

import pyarrow as pa

# (column, Spark type, Arrow type), in DataFrame order.
COLUMNS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("topic", "string", pa.string()),
    ("queue_id", "int", pa.int32()),
    ("queue_offset", "bigint", pa.int64()),
    ("commit_log_offset", "bigint", pa.int64()),
    ("size", "int", pa.int32()),
    ("tag", "string", pa.string()),
    ("keys", "array<string>", pa.list_(pa.string())),
    ("properties", "map<string,string>", pa.map_(pa.string(), pa.string())),
    ("born_timestamp", "timestamp", pa.timestamp("us", tz="UTC")),
    ("store_timestamp", "timestamp", pa.timestamp("us", tz="UTC")),
    ("born_host", "string", pa.string()),
    ("reconsume_times", "int", pa.int32()),
    ("body", "binary", pa.binary()),
    ("msg_id", "string", pa.string()),
)
COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _, _ in COLUMNS)
_SPARK_TYPES = {name: spark for name, spark, _ in COLUMNS}
_ARROW_TYPES = {name: arrow for name, _, arrow in COLUMNS}


class SchemaError(ValueError):
    """A requested column is not part of the gms schema."""


def select_columns(spec: str | None) -> tuple[str, ...]:
    """The columns named in a ``columns`` option ("a,b,c"), in schema order; all if empty."""
    if not spec or not spec.strip():
        return COLUMN_NAMES
    wanted = {part.strip() for part in spec.split(",") if part.strip()}
    unknown = wanted - set(COLUMN_NAMES)
    if unknown:
        raise SchemaError(f"unknown gms columns {sorted(unknown)}; the schema has {list(COLUMN_NAMES)}")
    return tuple(name for name in COLUMN_NAMES if name in wanted)


def ddl(columns: tuple[str, ...] = COLUMN_NAMES) -> str:
    return ", ".join(f"{name} {_SPARK_TYPES[name]}" for name in columns)


def arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([pa.field(name, _ARROW_TYPES[name]) for name in columns])


def check_requested(names: list[str]) -> tuple[str, ...]:
    """Validate a user-given schema's column names (they must be gms columns)."""
    unknown = [n for n in names if n not in _SPARK_TYPES]
    if unknown:
        raise SchemaError(f"unknown gms columns {unknown}; the schema has {list(COLUMN_NAMES)}")
    return tuple(names)
