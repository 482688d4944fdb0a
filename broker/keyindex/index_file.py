"""One key index file: RocketMQ's IndexFile, big-endian, fixed size::

    header   40 bytes
      0   4  magic           u32  INDEX_MAGIC
      4   4  slot_count      i32  hash slots in this file
      8   4  entry_capacity  i32  entries this file holds
      12  4  entry_count     i32  entries written
      16  8  begin_ts_ms     i64  lowest store time indexed (0: none yet)
      24  8  end_ts_ms       i64  highest store time indexed
      32  8  end_phys        i64  one past the commitlog offset of the last record indexed
    slots    slot_count x i32     per slot, the number (1-based) of its newest entry; 0 = none
    entries  entry_capacity x 28 bytes
      0   8  key_hash        i64  keys.key_hash(topic, key)
      8   8  phys_offset     i64  the record's commitlog offset
      16  8  store_ts_ms     i64  the record's store time
      24  4  prev            i32  the number of the slot's previous entry; 0 = end of chain

The file is named by the 20-digit commitlog offset of the first record it indexes. Entries are
written in commitlog order, so their offsets never decrease: truncation cuts a suffix. A lookup
reads the slot of ``hash % slot_count`` and follows ``prev`` (always a smaller number: a damaged
file cannot loop) -- newest first.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gms.broker.mapped_file import MappedFile
from gms.store_errors import StoreInvariantBroken, StoreIOError

INDEX_MAGIC = 0x474D534B  # "GMSK"
_HEADER = struct.Struct(">Iiiiqqq")
HEADER_SIZE = _HEADER.size
SLOT_DTYPE = np.dtype(">i4")
ENTRY_DTYPE = np.dtype([("hash", ">i8"), ("phys", ">i8"), ("store_ts_ms", ">i8"), ("prev", ">i4")])
_ENTRY = struct.Struct(">qqqi")
_SLOT = struct.Struct(">i")
_U64 = (1 << 64) - 1
assert HEADER_SIZE == 40 and ENTRY_DTYPE.itemsize == _ENTRY.size == 28


def file_size_bytes(slot_count: int, entry_capacity: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_DTYPE.itemsize + entry_capacity * ENTRY_DTYPE.itemsize


class IndexFile:
    """An open index file (:meth:`create` or :meth:`open`). One writer (the store's append lock);
    readers walk chains without a lock: an entry is written before a slot points at it."""

    def __init__(self, mapped: MappedFile) -> None:
        magic, slots, capacity, count, begin_ts, end_ts, end_phys = _HEADER.unpack_from(mapped.view)
        if magic != INDEX_MAGIC or file_size_bytes(slots, capacity) != mapped.size_bytes or not 0 <= count <= capacity:
            mapped.try_close()
            raise StoreIOError(f"{mapped.path} is not a key index file (magic {magic:#x}, {slots} slots,"
                               f" {count} of {capacity} entries in {mapped.size_bytes} bytes)")
        self._file = mapped
        self.slot_count, self.capacity, self.count = slots, capacity, count
        self.begin_ts_ms, self.end_ts_ms, self.end_phys = begin_ts, end_ts, end_phys
        self._entries_at = HEADER_SIZE + slots * SLOT_DTYPE.itemsize

    @classmethod
    def create(cls, directory: Path, begin_phys: int, slot_count: int, entry_capacity: int) -> IndexFile:
        # Blocks for the header and the slots (written anywhere); the entries' come as they are added.
        mapped = MappedFile.create(directory, begin_phys, file_size_bytes(slot_count, entry_capacity),
                                   allocate_bytes=HEADER_SIZE + slot_count * SLOT_DTYPE.itemsize)
        _HEADER.pack_into(mapped.view, 0, INDEX_MAGIC, slot_count, entry_capacity, 0, 0, 0, begin_phys)
        return cls(mapped)

    @classmethod
    def open(cls, path: Path, begin_phys: int) -> IndexFile:
        size = path.stat().st_size
        if size < HEADER_SIZE:
            raise StoreIOError(f"{path} is not a key index file ({size} bytes, shorter than its header)")
        return cls(MappedFile.open(path, begin_phys, size))

    @property
    def begin_phys(self) -> int:
        return self._file.base_offset

    @property
    def room(self) -> int:
        return self.capacity - self.count

    def _slots(self) -> np.ndarray:
        return self._file.array[HEADER_SIZE: self._entries_at].view(SLOT_DTYPE)

    def _entries(self, lo: int, hi: int) -> np.ndarray:
        """Entries [lo, hi) (0-based: entry number k is entries[k - 1])."""
        size = ENTRY_DTYPE.itemsize
        return self._file.array[self._entries_at + lo * size: self._entries_at + hi * size].view(ENTRY_DTYPE)

    def add(self, hashes: np.ndarray, phys: np.ndarray, store_ts_ms: np.ndarray) -> None:
        """Append entries (at most ``room``; ``phys`` ascending, from ``end_phys`` on), chaining
        each to its slot's newest entry -- within the batch too -- with a few numpy calls."""
        n = len(hashes)
        if not 0 < n <= self.room:
            raise StoreInvariantBroken(f"{n} key index entries added to a file with room for {self.room}")
        self._file.allocate_to(self._entries_at + (self.count + n) * ENTRY_DTYPE.itemsize)
        numbers = np.arange(self.count + 1, self.count + n + 1, dtype=np.int64)
        slot_of = self._slot_of(hashes)
        order, first, last = _group_by_slot(slot_of)
        slots = self._slots()
        prev_sorted = np.empty(n, np.int64)
        prev_sorted[first] = slots[slot_of[order[first]]]
        prev_sorted[1:][~first[1:]] = numbers[order[:-1]][~first[1:]]  # the batch's previous one in the slot
        entries = np.empty(n, ENTRY_DTYPE)
        entries["hash"], entries["phys"], entries["store_ts_ms"] = hashes, phys, store_ts_ms
        entries["prev"][order] = prev_sorted
        self._entries(self.count, self.count + n)[:] = entries
        slots[slot_of[order[last]]] = numbers[order[last]]
        self._advance(n, int(store_ts_ms.min()), int(store_ts_ms.max()), int(phys[-1]))

    def add_one(self, key_hash: int, phys: int, store_ts_ms: int) -> None:
        """:meth:`add` of one entry with ``struct`` (a single send: no numpy fixed costs)."""
        if self.room <= 0:
            raise StoreInvariantBroken("a key index entry added to a full file")
        number = self.count + 1
        self._file.allocate_to(self._entries_at + number * ENTRY_DTYPE.itemsize)
        slot_at = HEADER_SIZE + (key_hash & _U64) % self.slot_count * SLOT_DTYPE.itemsize
        view = self._file.view
        prev = _SLOT.unpack_from(view, slot_at)[0]
        _ENTRY.pack_into(view, self._entries_at + self.count * ENTRY_DTYPE.itemsize, key_hash, phys, store_ts_ms, prev)
        _SLOT.pack_into(view, slot_at, number)
        self._advance(1, store_ts_ms, store_ts_ms, phys)

    def _advance(self, added: int, low_ts_ms: int, high_ts_ms: int, last_phys: int) -> None:
        """Count entries just written and publish the header."""
        self.count += added
        self.begin_ts_ms = low_ts_ms if self.begin_ts_ms == 0 else min(self.begin_ts_ms, low_ts_ms)
        self.end_ts_ms = max(self.end_ts_ms, high_ts_ms)
        self.end_phys = max(self.end_phys, last_phys + 1)
        self._write_header()

    def truncate(self, phys_offset: int) -> None:
        """Drop the entries for records at or past ``phys_offset`` -- and any after the first
        whose offset goes backwards (entries a crash left half on disk) -- and rebuild the slots
        (also when a slot points past the entries kept)."""
        entries = self._entries(0, self.count)
        phys = entries["phys"]
        bad = np.flatnonzero((phys >= phys_offset) | (np.diff(phys, prepend=self.begin_phys) < 0))
        keep = int(bad[0]) if bad.size else self.count
        if keep == self.count and not (self._slots() > keep).any():  # a header flushed before its slots: rebuild
            return
        entries[keep:] = np.zeros(1, ENTRY_DTYPE)
        slots = self._slots()
        slots[:] = 0
        kept = entries[:keep]
        if keep:
            slot_of = self._slot_of(kept["hash"])
            order, _, last = _group_by_slot(slot_of)
            slots[slot_of[order[last]]] = order[last] + 1
        self.count = keep
        self.begin_ts_ms = int(kept["store_ts_ms"].min()) if keep else 0
        self.end_ts_ms = int(kept["store_ts_ms"].max()) if keep else 0
        self.end_phys = int(kept["phys"][-1]) + 1 if keep else self.begin_phys
        self._write_header()

    def _slot_of(self, hashes: np.ndarray) -> np.ndarray:
        """The slot of each hash: the unsigned value mod slot_count (read in native byte order
        first: a view of the big-endian entries as uint64 would swap the bytes)."""
        return (hashes.astype(np.int64).view(np.uint64) % np.uint64(self.slot_count)).astype(np.int64)

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        return self.count > 0 and self.begin_ts_ms <= end_ms and begin_ms <= self.end_ts_ms

    def walk(self, key_hash: int, begin_ms: int, end_ms: int) -> Iterator[int]:
        """Commitlog offsets of the entries with ``key_hash`` stored in [begin_ms, end_ms], newest first."""
        view = self._file.view
        at, size = self._entries_at - ENTRY_DTYPE.itemsize, ENTRY_DTYPE.itemsize  # entry k at at + k * size
        number = int(self._slots()[(key_hash & _U64) % self.slot_count])  # the slot of the unsigned hash
        while 0 < number <= self.capacity:
            found, phys, ts, prev = _ENTRY.unpack_from(view, at + number * size)
            if found == key_hash and begin_ms <= ts <= end_ms:
                yield phys
            if prev >= number:  # a chain only goes back: anything else is damage
                return
            number = prev

    def _write_header(self) -> None:
        _HEADER.pack_into(self._file.view, 0, INDEX_MAGIC, self.slot_count, self.capacity, self.count,
                          self.begin_ts_ms, self.end_ts_ms, self.end_phys)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.try_close()

    def delete(self) -> None:
        self._file.delete()


def _group_by_slot(slot_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A stable order of entries by slot, and in that order where each slot's run starts and ends."""
    order = np.argsort(slot_of, kind="stable")
    sorted_slots = slot_of[order]
    first = np.ones(len(order), bool)
    first[1:] = sorted_slots[1:] != sorted_slots[:-1]
    last = np.ones(len(order), bool)
    last[:-1] = first[1:]
    return order, first, last
