"""Kafka's message schemas, declared as Apache Kafka declares them and interpreted here.

``schemas/`` holds Apache Kafka's own JSON definitions (clients/src/main/resources/common/message,
Apache-2.0) of the APIs this adapter serves. A :class:`Message` reads and writes any version of
one of them from those definitions alone: which fields a version has, which are nullable, where a
flexible version uses compact lengths and tagged fields. No per-version code: a version this
adapter serves is a matter of what it advertises in ApiVersions (:mod:`.apis`).

Messages are plain dicts keyed by the fields' names in snake_case (``ErrorCode`` -> ``error_code``);
a field left out of a dict being written takes its default (0, "", empty array, its declared
default, or null where that version allows it).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from gms.broker.kafka.wire import Malformed, Reader, Writer

_NO_VERSIONS = (1, 0)  # an empty range
_METHODS = {"bool": "boolean"}  # a type -> the Reader's and Writer's method, where the names differ
_PRIMITIVES = frozenset(("bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string",
                         "bytes", "records", "uuid"))


def _range(spec: str | None) -> tuple[int, int]:
    if not spec or spec == "none":
        return _NO_VERSIONS
    if spec.endswith("+"):
        return int(spec[:-1]), 1 << 15
    low, _, high = spec.partition("-")
    return int(low), int(high or low)


def _in(versions: tuple[int, int], version: int) -> bool:
    return versions[0] <= version <= versions[1]


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


@dataclass(slots=True)
class Field:
    name: str
    kind: str  # a primitive, "struct", or "array"
    elem: str  # an array's element kind (a primitive or "struct"); "" otherwise
    versions: tuple[int, int]
    nullable: tuple[int, int]
    tagged: tuple[int, int]
    tag: int
    default: Any
    fields: list[Field] = field(default_factory=list)

    def default_value(self, version: int) -> Any:
        if self.kind == "array":
            return []
        if self.kind == "struct":
            return {}
        if self.default is not None:
            return self.default
        if self.kind in ("string", "bytes", "records") and _in(self.nullable, version):
            return None
        return _ZERO[self.kind]


_ZERO: dict[str, Any] = {"bool": False, "string": "", "bytes": b"", "records": None, "uuid": uuid.UUID(int=0),
                         "float64": 0.0, **dict.fromkeys(("int8", "int16", "uint16", "int32", "uint32", "int64"), 0)}


def _default(raw: Any, kind: str) -> Any:
    if raw is None or raw == "null":
        return None
    if kind == "bool":
        return str(raw).lower() == "true"
    if kind in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        text = str(raw)
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    if kind == "float64":
        return float(raw)
    if kind == "string":
        return str(raw)
    return None


def _field(spec: dict[str, Any]) -> Field:
    kind = spec["type"]
    elem = ""
    if kind.startswith("[]"):
        elem = kind[2:] if kind[2:] in _PRIMITIVES else "struct"
        kind = "array"
    elif kind not in _PRIMITIVES:
        kind = "struct"
    return Field(snake(spec["name"]), kind, elem, _range(spec.get("versions")), _range(spec.get("nullableVersions")),
                 _range(spec.get("taggedVersions")), int(spec.get("tag", -1)),
                 _default(spec.get("default"), kind), [_field(child) for child in spec.get("fields", ())])


def _strip_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


class Message:
    """One request or response schema: ``read`` and ``write`` of any of its versions."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name: str = spec["name"]
        self.api_key: int = spec["apiKey"]
        self.valid = _range(spec["validVersions"])
        self.flexible = _range(spec["flexibleVersions"])
        self.fields = [_field(f) for f in spec["fields"]]

    def is_flexible(self, version: int) -> bool:
        return _in(self.flexible, version)

    def read(self, reader: Reader, version: int) -> dict[str, Any]:
        return _read_struct(reader, self.fields, version, self.is_flexible(version))

    def write(self, writer: Writer, value: dict[str, Any], version: int) -> None:
        _write_struct(writer, self.fields, value, version, self.is_flexible(version))


@cache
def message(name: str) -> Message:
    """The schema of ``name`` (e.g. ``"FetchRequest"``) from ``schemas/``."""
    text = resources.files("gms.broker.kafka").joinpath(f"schemas/{name}.json").read_text()
    return Message(json.loads(_strip_comments(text)))


def _read_struct(r: Reader, fields: list[Field], version: int, flexible: bool) -> dict[str, Any]:
    value: dict[str, Any] = {}
    tagged: dict[int, Field] = {}
    for f in fields:
        if not _in(f.versions, version):
            continue
        if flexible and _in(f.tagged, version):
            tagged[f.tag] = f
            value[f.name] = f.default_value(version)
            continue
        value[f.name] = _read_value(r, f, f.kind, version, flexible)
    if flexible:
        for tag, raw in r.tagged().items():
            found = tagged.get(tag)
            if found is not None:
                value[found.name] = _read_value(Reader(raw), found, found.kind, version, flexible)
    return value


def _read_value(r: Reader, f: Field, kind: str, version: int, flexible: bool) -> Any:
    if kind == "array":
        n = r.length(flexible, "array")
        if n < 0:
            if not _in(f.nullable, version):
                raise Malformed(f"{f.name} is null")
            return None
        if n > r.remaining():  # each element takes at least a byte
            raise Malformed(f"{f.name}: {n} elements in {r.remaining()} bytes")
        return [_read_value(r, f, f.elem, version, flexible) for _ in range(n)]
    if kind == "struct":
        return _read_struct(r, f.fields, version, flexible)
    if kind == "string":
        text = r.string(flexible)
        if text is None and not _in(f.nullable, version):
            raise Malformed(f"{f.name} is null")
        return text
    if kind in ("bytes", "records"):
        blob = r.blob(flexible)
        if blob is None and not _in(f.nullable, version):
            raise Malformed(f"{f.name} is null")
        return blob
    return getattr(r, _METHODS.get(kind, kind))()


def _write_struct(w: Writer, fields: list[Field], value: dict[str, Any], version: int, flexible: bool) -> None:
    tagged: list[tuple[int, bytes]] = []
    for f in fields:
        if not _in(f.versions, version):
            continue
        v = value.get(f.name)
        if v is None and not (_in(f.nullable, version) and f.name in value):
            v = f.default_value(version)
        if flexible and _in(f.tagged, version):
            if v != f.default_value(version):
                inner = Writer()
                _write_value(inner, f, f.kind, v, version, flexible)
                tagged.append((f.tag, bytes(inner.buf)))
            continue
        _write_value(w, f, f.kind, v, version, flexible)
    if flexible:
        w.uvarint(len(tagged))
        for tag, raw in sorted(tagged):
            w.uvarint(tag)
            w.uvarint(len(raw))
            w.buf += raw


def _write_value(w: Writer, f: Field, kind: str, v: Any, version: int, flexible: bool) -> None:
    if kind == "array":
        if v is None:
            w.length(-1, flexible)
            return
        w.length(len(v), flexible)
        for item in v:
            _write_value(w, f, f.elem, item, version, flexible)
    elif kind == "struct":
        _write_struct(w, f.fields, v, version, flexible)
    elif kind == "string":
        w.string(v, flexible)
    elif kind in ("bytes", "records"):
        w.blob(v, flexible)
    else:
        getattr(w, _METHODS.get(kind, kind))(v)
