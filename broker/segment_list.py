"""The ordered, contiguous mapped files of one directory (RocketMQ's MappedFileQueue): the
commitlog is one, every consumeQueue is one.

``files`` is replaced, never mutated: a reader takes it once and indexes that snapshot by
arithmetic while the writer adds files and retention deletes them.

A file deleted while a reader still holds a view into its map (a response waiting in the send
buffer of a client that stopped reading) is taken out of the list and unlinked at once -- Linux
frees its blocks when the last mapping goes -- and kept in ``closing`` until a later
:meth:`SegmentList.close_released` finds it released. One slow reader never holds up the
deletion of the files after it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from gms.broker.mapped_file import MappedFile, PendingDirSyncs, fsync_dir, list_files
from gms.private_files import make_private_dir
from gms.store_errors import StoreInvariantBroken

log = logging.getLogger(__name__)


def newest_run(files: Sequence[tuple[int, int]]) -> int:
    """The index of the first file of the newest contiguous run among ``files`` ((base offset,
    size in bytes), in offset order): a file continues the run when it starts where the one
    before it ends. The files before a hole (some deleted by hand) are not read."""
    first = 0
    for i, ((prev, size), (cur, _)) in enumerate(itertools.pairwise(files), 1):
        if cur != prev + size:
            first = i
    return first


class SegmentList:
    def __init__(self, directory: Path, file_size_bytes: int, files: list[MappedFile]) -> None:
        self.directory = directory
        self.file_size_bytes = file_size_bytes
        self.files = files  # replaced, never mutated: readers take a snapshot
        self.closing: list[MappedFile] = []  # deleted (unlinked) but still mapped by a reader
        self.unsynced_dirs = PendingDirSyncs()  # made or given a file by create(sync_dirs=False)

    @classmethod
    def load(cls, directory: Path, file_size_bytes: int) -> SegmentList:
        """Map the files of ``directory``. After a hole (files deleted by hand) only the newest
        contiguous run is mapped; the older files are left on disk. A missing directory is an
        empty list: it is made with its first file if no one made it before."""
        if not directory.is_dir():
            return cls(directory, file_size_bytes, [])
        found = []
        for base, path in list_files(directory):
            if path.stat().st_size == 0:  # a crash between creating it and allocating it: nothing in it
                log.warning("%s: removing the empty file %s left by a crash", directory, path.name)
                path.unlink()
            else:
                found.append((base, path))
        first = newest_run([(base, file_size_bytes) for base, _ in found])
        if first:
            log.warning("%s: files missing before %s; the %d older file(s) are ignored",
                        directory, found[first][1].name, first)
        files: list[MappedFile] = []
        try:
            for base, path in found[first:]:
                files.append(MappedFile.open(path, base, file_size_bytes))
        except BaseException:
            for f in files:
                f.try_close()
            raise
        return cls(directory, file_size_bytes, files)

    def file_for(self, offset: int, files: list[MappedFile] | None = None) -> MappedFile | None:
        """The file of ``files`` (default: the current list) holding byte ``offset``; None if
        no file does."""
        files = self.files if files is None else files
        if not files or offset < files[0].base_offset:
            return None
        index = (offset - files[0].base_offset) // self.file_size_bytes
        return files[index] if index < len(files) else None

    def create(self, base_offset: int, *, sync_dirs: bool = True) -> MappedFile:
        """A new file of this list's directory and size (not in the list yet: see :meth:`append`),
        without blocks: its writer allocates them as it goes (:meth:`MappedFile.allocate_to`).
        ``sync_dirs=False`` leaves the directory syncs that make the file's name (and the new
        directories') survive a crash to :meth:`sync_dirs` (a consumeQueue's first file is made by
        the append on the request loop, where a directory fsync per new queue would stall every
        send; its checkpoint syncs them before it counts any entry of the file as durable)."""
        made = _make_dir(self.directory)
        if sync_dirs:
            for directory in made:
                fsync_dir(directory)
        else:
            self.unsynced_dirs.add([*made, self.directory])
        return MappedFile.create(self.directory, base_offset, self.file_size_bytes, allocate_bytes=0,
                                 sync_dir=sync_dirs)

    def sync_dirs(self) -> None:
        """fsync the directories :meth:`create` left unsynced."""
        self.unsynced_dirs.sync()

    def append(self, f: MappedFile) -> None:
        if self.files and f.base_offset != self.files[-1].end_offset:
            raise StoreInvariantBroken(f"{f.path} does not follow {self.files[-1].path}")
        self.files = [*self.files, f]

    def take_from(self, base_offset: int) -> list[MappedFile]:
        """Remove the files starting at or after ``base_offset`` from the list and return them."""
        keep = [f for f in self.files if f.base_offset < base_offset]
        taken = self.files[len(keep):]
        if taken:
            self.files = keep
        return taken

    def delete_from(self, base_offset: int) -> None:
        """Delete the files starting at or after ``base_offset`` (all of them for 0)."""
        for f in self.take_from(base_offset):
            self._retire(f)
        self.close_released()

    def delete_oldest(self, should_delete: Callable[[MappedFile], bool], keep: int = 1) -> int:
        """Delete files from the oldest while ``should_delete`` says so, always keeping the newest
        ``keep``; returns the number deleted. A file a reader holds goes from the list and the
        disk all the same and is closed once released."""
        self.close_released()
        deleted = 0
        while len(self.files) > keep and should_delete(self.files[0]):
            victim = self.files[0]
            self.files = self.files[1:]
            self._retire(victim)
            deleted += 1
        return deleted

    def _retire(self, f: MappedFile) -> None:
        if not f.delete():
            log.info("%s deleted while a reader holds it: closed once released", f.path)
            self.closing = [*self.closing, f]

    def close_released(self) -> None:
        """Close the deleted files no reader holds any more."""
        if self.closing:
            self.closing = [f for f in self.closing if not f.try_close()]

    def close(self) -> None:
        """Unmap every file no reader holds (a held one stays mapped until the process ends)."""
        for f in self.files:
            f.try_close()
        self.close_released()


def _make_dir(directory: Path) -> list[Path]:
    """Make ``directory`` and its missing parents; the directories whose entries changed, to be
    synced so that a crash keeps the file about to be created in it reachable."""
    if directory.is_dir():
        return []
    changed = _make_dir(directory.parent)
    make_private_dir(directory)
    return [*changed, directory.parent]
