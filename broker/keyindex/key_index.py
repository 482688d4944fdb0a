"""The key index of a store: its index files in commitlog order, the newest one written."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gms.broker.keyindex.index_file import IndexFile
from gms.broker.keyindex.keys import batch_keys, key_hash, record_key_hashes
from gms.broker.mapped_file import list_files
from gms.private_files import make_private_dir
from gms.record.batch import ParsedRecords
from gms.store_errors import StoreIOError

TIME_MAX_MS = (1 << 63) - 1
log = logging.getLogger(__name__)


class KeyIndex:
    """Open with :meth:`open`. Writes (``add``, ``truncate``, ``delete_below``) come from one
    thread at a time (the store's append lock); ``find`` runs beside them."""

    def __init__(self, directory: Path, files: list[IndexFile], slot_count: int, entries_per_file: int,
                 lost_from: int | None = None) -> None:
        self.directory = directory
        self.files = files
        self.slot_count = slot_count
        self.entries_per_file = entries_per_file
        # The commitlog offset from which :meth:`open` dropped damaged files: the store re-indexes from there.
        self.lost_from = lost_from

    @classmethod
    def open(cls, directory: Path, *, slot_count: int, entries_per_file: int) -> KeyIndex:
        """The index under ``directory`` (created if missing). New files get ``slot_count`` slots
        and ``entries_per_file`` entries; existing ones keep the geometry in their header.

        The index is derived from the commitlog, so a damaged file (a bad header: a flipped bit,
        a file cut short) is never a reason to refuse to start: it and the files after it are
        deleted and :attr:`lost_from` says where re-indexing must begin."""
        make_private_dir(directory)
        files: list[IndexFile] = []
        lost_from: int | None = None
        try:
            for base, path in list_files(directory):
                if lost_from is None:
                    try:
                        files.append(IndexFile.open(path, base))
                        continue
                    except StoreIOError as err:
                        log.warning("%s: dropping it and the index files after it (re-indexed from the commitlog)",
                                    err)
                        lost_from = base
                path.unlink()
        except BaseException:
            for f in files:
                f.close()
            raise
        return cls(directory, files, slot_count, entries_per_file, lost_from)

    @property
    def end_phys(self) -> int:
        """One past the last record indexed (0: none)."""
        return self.files[-1].end_phys if self.files else 0

    def add(self, arr: np.ndarray, parsed: ParsedRecords, phys: np.ndarray, store_ts_ms: np.ndarray) -> None:
        """Index the keys of ``parsed`` records (at ``parsed.starts`` of ``arr``), stored at
        ``phys`` (ascending) at ``store_ts_ms``. The files the entries need are created before
        any entry is written: a failure (disk full) leaves the index as it was."""
        keys = batch_keys(arr, parsed.starts, parsed.headers, parsed.topics, parsed.topic_index)
        n = len(keys.hashes)
        if not n:
            return
        key_phys, key_ts = phys[keys.records], np.broadcast_to(store_ts_ms, len(phys))[keys.records]
        done = 0
        for f in self._make_room(key_phys):
            take = min(f.room, n - done)
            if take:
                f.add(keys.hashes[done: done + take], key_phys[done: done + take], key_ts[done: done + take])
                done += take

    def add_one(self, topic: str, raw_keys: bytes, phys: int, store_ts_ms: int) -> None:
        """:meth:`add` of one record of ``topic`` whose keys field is ``raw_keys`` (no numpy)."""
        hashes = record_key_hashes(topic, raw_keys)
        targets = self._make_room([phys] * len(hashes)) if hashes else []
        for f in targets:
            while hashes and f.room:
                f.add_one(hashes.pop(0), phys, store_ts_ms)

    def _make_room(self, key_phys: np.ndarray | list[int]) -> list[IndexFile]:
        """The active file and as many new ones as entries for records at ``key_phys`` need,
        each named by the offset of its first record (one more than the previous file's name
        when a record's keys fill a whole file)."""
        targets = self.files[-1:] if self.files and self.files[-1].room else []
        placed = targets[0].room if targets else 0
        while placed < len(key_phys):
            begin = int(key_phys[placed])
            if self.files and begin <= self.files[-1].begin_phys:
                begin = self.files[-1].begin_phys + 1
            f = IndexFile.create(self.directory, begin, self.slot_count, self.entries_per_file)
            self.files.append(f)
            targets.append(f)
            placed += f.room
        return targets

    def truncate(self, phys_offset: int) -> None:
        """Forget the entries of records at or past ``phys_offset`` (recovery re-adds them)."""
        while self.files and self.files[-1].begin_phys >= phys_offset:
            self.files.pop().delete()
        if self.files:
            self.files[-1].truncate(phys_offset)

    def delete_below(self, phys_offset: int) -> int:
        """Delete the files whose records all lie below ``phys_offset`` (the commitlog's minimum),
        never the newest; returns how many."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].end_phys <= phys_offset:
            self.files.pop(0).delete()
            deleted += 1
        return deleted

    def find(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = TIME_MAX_MS) -> Iterator[int]:
        """Commitlog offsets of the records that may carry ``key`` in ``topic``, stored in
        [begin_ms, end_ms], newest first. Hashes collide: the caller checks each record."""
        wanted = key_hash(topic, key)
        seen: set[int] = set()  # a record carrying the key twice has two entries
        for f in reversed(list(self.files)):
            if not f.overlaps(begin_ms, end_ms):
                continue
            try:
                for phys in f.walk(wanted, begin_ms, end_ms):
                    if phys not in seen:
                        seen.add(phys)
                        yield phys
            except ValueError:  # retention closed the file meanwhile: its records are gone
                continue

    def flush(self) -> None:
        for f in list(self.files):
            f.flush()

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


