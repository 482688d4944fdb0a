"""The keys of many records at once, each hashed with its record's topic: what the key index
stores. Keys are split and hashed with numpy over the whole batch (no Python per message): a
polynomial hash of each key's bytes (mod 2**64, reduced per key with ``np.add.reduceat``),
mixed with the key's length and the topic's xxhash64, then a splitmix64 finaliser so the low
bits that pick a hash slot are as good as the high ones. :func:`key_hash` is its scalar twin,
for a lookup's key and a single send (where numpy's fixed costs would be most of the work); the
tests check that both agree."""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import xxhash

from gms.record.layout import HEADER_SIZE, KEY_SEPARATOR, OFFSETS

_SEPARATOR = ord(KEY_SEPARATOR)
_PRIME = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime: odd, so no power of it is 0 mod 2**64
_LENGTH_MIX = np.uint64(0x9E3779B97F4A7C15)  # golden ratio: keeps "a" and "\0a" apart
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31))
_TOPICS_CACHED_MAX = 4096
_U64 = (1 << 64) - 1
_PRIME_INT, _LENGTH_MIX_INT, _MIX_1_INT, _MIX_2_INT = int(_PRIME), int(_LENGTH_MIX), int(_MIX_1), int(_MIX_2)
_SEPARATOR_BYTES = KEY_SEPARATOR.encode()


class RecordKeys(NamedTuple):
    """The keys of a batch: one row per key (a record with three keys has three)."""

    records: np.ndarray  # intp: the index of the key's record in the batch
    hashes: np.ndarray  # int64: key_hash(topic, key)


_NO_KEYS = RecordKeys(np.empty(0, np.intp), np.empty(0, np.int64))


@lru_cache(maxsize=_TOPICS_CACHED_MAX)
def _topic_hash(topic: str) -> int:
    return xxhash.xxh64_intdigest(topic.encode())


def key_hash(topic: str, key: str) -> int:
    """The index hash of one key of ``topic`` (ValueError for an empty key or one holding the
    key separator: no stored record can carry it)."""
    raw = key.encode()
    if not raw or _SEPARATOR in raw:
        raise ValueError(f"a message key is non-empty and holds no {KEY_SEPARATOR!r}: {key!r}")
    return raw_key_hash(_topic_hash(topic), raw)


def raw_key_hash(topic_hash: int, raw: bytes) -> int:
    """:func:`key_hash` of a key's utf-8 bytes, given its topic's xxhash64 (as a signed int64)."""
    total = 0
    for byte in raw:
        total = (total * _PRIME_INT + byte) & _U64
    mixed = _mix_int(_mix_int(total ^ (len(raw) * _LENGTH_MIX_INT & _U64)) ^ topic_hash)
    return mixed - (1 << 64) if mixed >= 1 << 63 else mixed


_NAME_LENGTHS = struct.Struct(">BBBxH")  # topic_len, tag_len, born_host_len, reserved, keys_len
_NAME_LENGTHS_AT = OFFSETS["topic_len"]


def keys_field(record: memoryview) -> bytes:
    """The keys field of one checked record (b"" when it has none)."""
    topic_len, tag_len, born_host_len, keys_len = _NAME_LENGTHS.unpack_from(record, _NAME_LENGTHS_AT)
    if not keys_len:
        return b""
    at = HEADER_SIZE + topic_len + tag_len + born_host_len
    return bytes(record[at: at + keys_len])


def record_key_hashes(topic: str, raw_keys: bytes) -> list[int]:
    """The hashes of a record's keys field (keys separated by KEY_SEPARATOR; empty ones skipped)."""
    topic_hash = _topic_hash(topic)
    return [raw_key_hash(topic_hash, key) for key in raw_keys.split(_SEPARATOR_BYTES) if key]


def _mix_int(x: int) -> int:
    """:func:`_mix` of one value."""
    x = ((x ^ (x >> 30)) * _MIX_1_INT) & _U64
    x = ((x ^ (x >> 27)) * _MIX_2_INT) & _U64
    return x ^ (x >> 31)


def batch_keys(arr: np.ndarray, starts: np.ndarray, headers: np.ndarray, topics: list[str],
               topic_index: np.ndarray) -> RecordKeys:
    """The keys of the records at ``starts`` of ``arr`` (uint8) whose ``headers`` (HEADER_DTYPE)
    are checked; ``topics[topic_index[i]]`` is record i's topic. A record whose keys field would
    reach past its end (a damaged header recovery keeps) gives none."""
    if not headers["keys_len"].any():  # as in most sends: one pass instead of the offsets' arithmetic
        return _NO_KEYS
    lens = headers["keys_len"].astype(np.int64)
    keys_at = (starts + HEADER_SIZE + headers["topic_len"].astype(np.int64) + headers["tag_len"]
               + headers["born_host_len"])
    usable = (lens > 0) & (keys_at + lens <= np.minimum(starts + headers["total_size"], len(arr)))
    with_keys = np.flatnonzero(usable)
    if not with_keys.size:
        return _NO_KEYS
    lens, keys_at = lens[with_keys], keys_at[with_keys]
    ends = np.cumsum(lens)
    firsts = ends - lens
    raw = arr[np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(keys_at - firsts, lens)]
    topic_hashes = np.array([_topic_hash(t) for t in topics], np.uint64)[topic_index[with_keys]]
    fields, hashes = _hash_keys(raw, firsts, topic_hashes)
    return RecordKeys(with_keys[fields], hashes)


def _hash_keys(raw: np.ndarray, firsts: np.ndarray, topic_hashes: np.ndarray) -> RecordKeys:
    """Split ``raw`` (keys fields back to back, field i starting at ``firsts[i]``) at separators
    and hash every key with its field's ``topic_hashes[i]``; ``records`` are field indexes."""
    separators = raw == _SEPARATOR
    if separators.any():  # some record has several keys: split at separators, drop empty keys
        after_break = np.empty(len(raw), bool)  # the byte follows a separator or starts a field
        after_break[0] = True
        after_break[1:] = separators[:-1]
        after_break[firsts] = True
        kept = np.flatnonzero(~separators)
        if not kept.size:
            return _NO_KEYS
        key_starts = np.flatnonzero(after_break[kept])  # positions in ``kept`` where each key begins
        fields = np.searchsorted(firsts, kept[key_starts], side="right") - 1
        raw = raw[kept]
    else:  # one key per record (the usual batch): the fields are the keys
        key_starts, fields = firsts, np.arange(len(firsts))
    lengths = np.diff(key_starts, append=len(raw))
    exponents = np.repeat(key_starts + lengths - 1, lengths) - np.arange(len(raw))
    powers = np.empty(int(lengths.max()), np.uint64)
    powers[0] = 1
    np.cumprod(np.full(len(powers) - 1, _PRIME), out=powers[1:])
    sums = np.add.reduceat(raw.astype(np.uint64) * powers[exponents], key_starts)
    mixed = _mix(_mix(sums ^ (lengths.astype(np.uint64) * _LENGTH_MIX)) ^ topic_hashes[fields])
    return RecordKeys(fields, mixed.view(np.int64))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic, as numpy arrays do)."""
    x = (x ^ (x >> _SHIFTS[0])) * _MIX_1
    x = (x ^ (x >> _SHIFTS[1])) * _MIX_2
    return x ^ (x >> _SHIFTS[2])
