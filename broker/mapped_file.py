"""A fixed-size file mapped with mmap: the unit of the commitlog and of every consumeQueue.

Files are named by their 20-digit starting offset (RocketMQ's MappedFile), so the file holding
an offset is found by arithmetic. Writes go through the map; durability is ``os.fdatasync``, which
releases the GIL (``mmap.flush`` would hold it for the whole msync).

A mapped file costs one file descriptor, the one CPython's ``mmap`` keeps (a dup of the one it was
made from, which is closed at once); a flush or a warm-up read opens the file for the moment it
needs a descriptor. Before a file is created, :func:`check_fd_headroom` refuses with
:class:`DescriptorLimitReached` while fewer than ``FD_HEADROOM`` descriptors would be left, so
sockets, those short-lived opens and the checkpoint do not meet ``EMFILE``.

A file has its full size from the start but blocks only where it is about to be written: writers
call :meth:`MappedFile.allocate_to` before they write (growing the allocated stretch from the
start, in steps of an eighth of what it has), so a file costs on disk about what it holds, and a full disk is an
error the write is refused with -- never a SIGBUS on the page fault of a write through the map.
On tmpfs even a read of a hole through a map takes memory (and is a SIGBUS when there is none),
and the blocks are memory anyway: there files are allocated whole, as they are created or opened.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from gms.private_files import open_private
from gms.store_errors import DescriptorLimitReached, StoreIOError

FILE_NAME_DIGITS = 20
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux's number; Python 3.11 does not name it


def libc_function(name: str, argtypes: tuple[Any, ...]) -> Callable[..., int] | None:
    """libc's ``name`` through ctypes (which lets go of the GIL for the call); None if missing."""
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return cast(Callable[..., int], function)


_madvise = libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
_fstatfs = libc_function("fstatfs", (ctypes.c_int, ctypes.c_void_p))
TMPFS_MAGIC = 0x01021994  # statfs's f_type of tmpfs (linux/magic.h)
_STATFS_BYTES = 256  # more than struct statfs takes; its first field is f_type (a C long)
_mincore = libc_function("mincore", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p))
WARM_CHUNK_BYTES = 4 << 20  # read in slices so a close or a delete is never held up long
WARM_PAUSE_S = 0.02  # how long warming waits before it asks again whether it may go on
# A file's allocated stretch grows by an eighth of what it has, at least and at most these: at
# most 12.5 % (or 64 KiB) allocated ahead of the data, some 75 calls for a 1 GiB file.
ALLOCATE_GROWTH_DIVISOR = 8
ALLOCATE_STEP_MIN_BYTES = 64 << 10
ALLOCATE_STEP_MAX_BYTES = 64 << 20
# Descriptors a new file must leave free: client and replica sockets, the short-lived opens of
# flushes, directory syncs and atomically replaced config files.
FD_HEADROOM = 64


def _faults_in_holes(fd: int) -> bool:
    """Whether reading a hole of this file through a map allocates (tmpfs: it takes a page of
    memory, a SIGBUS when the filesystem is full), so the file must be allocated whole."""
    if _fstatfs is None:
        return False
    buf = ctypes.create_string_buffer(_STATFS_BYTES)
    return _fstatfs(fd, buf) == 0 and ctypes.c_long.from_buffer(buf).value == TMPFS_MAGIC


def file_name(base_offset: int) -> str:
    return f"{base_offset:0{FILE_NAME_DIGITS}d}"


def list_files(directory: Path) -> list[tuple[int, Path]]:
    """(base offset, path) of the mapped files in ``directory``, in offset order."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        if len(path.name) == FILE_NAME_DIGITS and path.name.isdigit():
            found.append((int(path.name), path))
    return sorted(found)


def check_fd_headroom(path: Path) -> None:
    """Refuse to create ``path`` while fewer than FD_HEADROOM descriptors are left below the
    soft RLIMIT_NOFILE (the broker raises it to the hard limit at start)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:  # EMFILE itself: not even the listing could open a descriptor
        in_use = soft
    if in_use + FD_HEADROOM > soft:
        raise DescriptorLimitReached(str(path), in_use, soft, FD_HEADROOM)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PendingDirSyncs:
    """Directories whose entries changed (a file or directory made in them) and are not synced
    yet: :meth:`sync` fsyncs them, deepest first, before whatever counts on those entries is
    called durable. Made on one thread, synced by the checkpoint on another."""

    def __init__(self) -> None:
        self._dirs: set[Path] = set()
        self._lock = threading.Lock()

    def add(self, dirs: Iterable[Path]) -> None:
        with self._lock:
            self._dirs.update(dirs)

    def sync(self) -> None:
        """fsync them (one deleted since needs none); on a failure they stay pending."""
        with self._lock:
            dirs, self._dirs = self._dirs, set()
        for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
            try:
                fsync_dir(directory)
            except FileNotFoundError:
                pass
            except BaseException:
                self.add(dirs)
                raise


def tree_disk_bytes(root: Path) -> int:
    """What ``du`` says ``root`` takes: the allocated blocks (st_blocks × 512) of it and of
    everything under it. Files and directories that go while it walks are left out."""
    total, pending = 0, [str(root)]
    with contextlib.suppress(OSError):
        total = os.stat(root).st_blocks * 512
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                except OSError:
                    continue
    return total


ZERO_CHUNK_BYTES = 1 << 20  # recovery truncation checks (and zeroes) the tail this much at a time


class MappedFile:
    """One mapped file; ``view`` and ``array`` are cached zero-copy windows on the map."""

    # Slots: a broker holds one per consumeQueue file, thousands of them.
    __slots__ = (
        "_address",
        "_array",
        "_mm",
        "_view",
        "allocated",
        "base_offset",
        "closed",
        "deleted",
        "device",
        "path",
        "size_bytes",
    )

    def __init__(self, path: Path, base_offset: int, size_bytes: int, mm: mmap.mmap, allocated: int,
                 device: int) -> None:
        self.path = path
        self.device = device  # st_dev: the filesystem it is on (FilesystemSync)
        self.base_offset = base_offset
        self.size_bytes = size_bytes
        self.allocated = allocated  # [0, allocated) is known to have blocks (see allocate_to)
        self._mm = mm
        self._view: memoryview | None = memoryview(mm)
        self._array: np.ndarray | None = None
        self._address: int | None = None  # where the map starts in memory (see _base_address)
        self.closed = False
        self.deleted = False  # unlinked; the map may outlive the name while a reader holds it

    @classmethod
    def create(cls, directory: Path, base_offset: int, size_bytes: int,
               allocate_bytes: int | None = None, *, sync_dir: bool = True) -> MappedFile:
        """Create a new zero-filled file (0600) of ``size_bytes``, with blocks for its first
        ``allocate_bytes`` (default: all of it); the rest as it is written (:meth:`allocate_to`).
        ``sync_dir=False``: the caller syncs ``directory`` before the file's contents count."""
        path = directory / file_name(base_offset)
        check_fd_headroom(path)
        try:
            fd = open_private(path, os.O_RDWR | os.O_EXCL)
        except OSError as err:
            raise StoreIOError(f"cannot create {path}: {err}") from err
        mm = None
        allocate = size_bytes
        try:
            try:
                device = os.fstat(fd).st_dev
                if allocate_bytes is not None and not _faults_in_holes(fd):
                    allocate = min(allocate_bytes, size_bytes)
                if allocate:
                    os.posix_fallocate(fd, 0, allocate)
                os.ftruncate(fd, size_bytes)
                mm = mmap.mmap(fd, size_bytes)
            finally:
                os.close(fd)
            if sync_dir:
                fsync_dir(directory)
        except OSError as err:
            if mm is not None:
                mm.close()
            path.unlink(missing_ok=True)
            raise StoreIOError(f"cannot allocate {allocate} bytes for {path}: {err}") from err
        return cls(path, base_offset, size_bytes, mm, allocate, device)

    @classmethod
    def open(cls, path: Path, base_offset: int, size_bytes: int) -> MappedFile:
        """Map an existing file; its blocks are found as it is written (:meth:`allocate_to`
        allocates what is missing, a no-op where blocks are) -- on tmpfs, all of them now."""
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as err:
            raise StoreIOError(f"cannot open {path}: {err}") from err
        try:
            stat = os.fstat(fd)
            actual, device = stat.st_size, stat.st_dev
            if actual > size_bytes:  # never cut a file down: that would drop data
                raise OSError(f"it is {actual} bytes, more than the {size_bytes} configured")
            allocated = size_bytes if _faults_in_holes(fd) else 0
            if allocated:
                os.posix_fallocate(fd, 0, size_bytes)
            elif actual < size_bytes:  # cut short by a crash while being created: blocks come with the writes
                os.ftruncate(fd, size_bytes)
            mm = mmap.mmap(fd, size_bytes)
        except OSError as err:
            raise StoreIOError(f"cannot map {path}: {err}") from err
        finally:
            os.close(fd)
        return cls(path, base_offset, size_bytes, mm, allocated, device)

    def allocate_to(self, end: int) -> None:
        """Give [0, ``end``) blocks before anything is written there (a write through the map to
        a page without blocks on a full disk is a SIGBUS; this is a StoreIOError the caller
        refuses the write with). Grows by at least an eighth of what is allocated (between
        ALLOCATE_STEP_MIN_BYTES and ALLOCATE_STEP_MAX_BYTES): few calls, little waste."""
        if end <= self.allocated:
            return
        step = min(max(self.allocated // ALLOCATE_GROWTH_DIVISOR, ALLOCATE_STEP_MIN_BYTES), ALLOCATE_STEP_MAX_BYTES)
        target = min(self.size_bytes, -(-max(end, self.allocated + step) // mmap.PAGESIZE) * mmap.PAGESIZE)
        try:
            fd = os.open(self.path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, self.allocated, target - self.allocated)
            finally:
                os.close(fd)
        except OSError as err:
            raise StoreIOError(f"cannot allocate {target - self.allocated} bytes for {self.path}: {err}") from err
        self.allocated = target

    def cache_zero_pages(self, start: int, end: int) -> None:
        """Write zeros over the whole pages from ``start`` (rounded up) to ``end`` (rounded up),
        a stretch the caller knows holds only zeros and has blocks (:meth:`allocate_to`): it puts
        those pages in the page cache. The first write through the map to a page that has blocks
        but was never written reads it from the device first (a major fault: 0.6-1.3 ms on this
        project's test machine), and a consumeQueue among thousands meets a new page at nearly
        every append. Only the pages about to be written: pages in the cache near a fault are
        mapped with it (fault-around) and count in the broker's resident memory."""
        page = mmap.PAGESIZE
        start, end = -(-start // page) * page, min(self.size_bytes, -(-end // page) * page)
        if start >= end:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes(end - start), start)
            finally:
                os.close(fd)
        except OSError as err:
            raise StoreIOError(f"cannot write {end - start} bytes of {self.path}: {err}") from err

    def disk_bytes(self) -> int:
        """The blocks the file takes on disk (what ``du`` counts; 0 once deleted)."""
        try:
            return os.stat(self.path).st_blocks * 512
        except OSError:
            return 0

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size_bytes

    @property
    def view(self) -> memoryview:
        if self._view is None:
            self._view = memoryview(self._mm)
        return self._view

    @property
    def array(self) -> np.ndarray:
        """The map as a uint8 numpy array (for vectorised patches and gathers)."""
        if self._array is None:
            self._array = np.frombuffer(self._mm, np.uint8)
        return self._array

    def write(self, pos: int, data: bytes | memoryview) -> None:
        self._mm[pos: pos + len(data)] = data

    def flush(self) -> None:
        """fdatasync through a descriptor opened for the call: the map's dirty pages belong to the
        file, whichever descriptor syncs them (and the map keeps the file's error state)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as err:
            if isinstance(err, FileNotFoundError) and self.deleted:
                return  # deleted under a flush (retention, truncation): nothing of it must last
            raise StoreIOError(f"fdatasync of {self.path} failed: {err}") from err

    def release(self, start: int, end: int) -> None:
        """Unmap the pages of [start, end) from this process (MADV_DONTNEED) without touching the
        file: they stay in the page cache (and on disk), the next read maps them again. Only for
        flushed data: the resident set then holds the file's hot tail, not all it ever wrote."""
        start = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        end = min(end, self.size_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= start or self.closed:
            return
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):  # closed under us (retention), or refused: only an optimisation
            return

    def populate(self, start: int, end: int) -> None:
        """Map the pages of [start, end) at once (MADV_POPULATE_READ, Linux 5.14+) before reading
        a stretch :meth:`release` unmapped: one system call instead of a page fault per page.
        Called through ctypes, which lets go of the GIL: pages no longer cached are read from
        the disk without stalling the event loop (mmap.madvise would hold it)."""
        start = start // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(end, self.size_bytes)
        if end <= start or self.closed or _madvise is None or (address := self._base_address()) is None:
            return
        _madvise(address + start, end - start, MADV_POPULATE_READ)  # a failure: the reads fault them in

    def resident_fraction(self, end: int) -> float:
        """The fraction of the pages of [0, end) in the page cache (mincore; 0.0 if unknown)."""
        end = min(end, self.size_bytes)
        if end <= 0 or self.closed or _mincore is None or (address := self._base_address()) is None:
            return 0.0
        pages = -(-end // mmap.PAGESIZE)
        vector = np.zeros(pages, np.uint8)
        if _mincore(address, end, vector.ctypes.data) != 0:
            return 0.0
        return float(np.count_nonzero(vector & 1)) / pages

    def _base_address(self) -> int | None:
        """Where the map starts in memory (for madvise and mincore through ctypes)."""
        if self._address is None:
            try:
                self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
            except (TypeError, ValueError, BufferError):
                return None
        return self._address

    def warm(self, stop: Callable[[], bool] = lambda: False, wait: Callable[[], bool] = lambda: False) -> None:
        """Bring the file's pages into the page cache so the writer's first touch only maps them
        (a cold first touch costs 5-10x a resident copy). Reading, not MADV_POPULATE_WRITE:
        pre-dirtying a GiB of pages gets the writer throttled by dirty-page writeback.
        Gives up once ``stop()`` says the writer arrived; pauses while ``wait()`` says so."""
        scratch = bytearray(WARM_CHUNK_BYTES)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # deleted, or no descriptor to spare: warming is only an optimisation
        try:
            for pos in range(0, self.size_bytes, WARM_CHUNK_BYTES):
                while not (self.closed or stop()) and wait():
                    time.sleep(WARM_PAUSE_S)
                if self.closed or stop():
                    return
                os.preadv(fd, [scratch], pos)
        except OSError:
            return
        finally:
            os.close(fd)

    def zero_from(self, pos: int) -> None:
        """Erase everything from ``pos`` to the end (recovery truncation) and make it durable.
        Only what holds data is looked at: the stretches the filesystem reports as data
        (``SEEK_DATA``; allocated, never written blocks are holes to it), read with pread, and
        of each chunk only the bytes from its first to its last non-zero one are written -- a
        preallocated 1 GiB file is not rewritten whole, and a queue cut back by a few entries
        maps the page or two it writes, not the file's pages."""
        dirty = False
        for lo, hi in self._data_stretches(pos):
            for i, raw in enumerate(self.read_chunks(lo, hi, ZERO_CHUNK_BYTES)):
                nonzero = np.flatnonzero(np.frombuffer(raw, np.uint8))
                if nonzero.size:
                    start = lo + i * ZERO_CHUNK_BYTES
                    self.array[start + int(nonzero[0]): start + int(nonzero[-1]) + 1] = 0
                    dirty = True
        if dirty:
            self.flush()

    def read_chunks(self, start: int, end: int, chunk_bytes: int) -> Iterator[bytes]:
        """The bytes of [start, end) in pieces of ``chunk_bytes``, read with pread, not through
        the map: a scan of a file at open leaves no pages in the process's resident set."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as err:
            raise StoreIOError(f"cannot open {self.path}: {err}") from err
        try:
            for pos in range(start, min(end, self.size_bytes), chunk_bytes):
                yield os.pread(fd, min(chunk_bytes, end - pos), pos)
        except OSError as err:
            raise StoreIOError(f"cannot read {self.path}: {err}") from err
        finally:
            os.close(fd)

    def data_end(self) -> int:
        """Where the last stretch the filesystem holds as data ends (``SEEK_DATA``/``SEEK_HOLE``;
        the file's size where it cannot tell): everything past it reads as zeros, so a scan for
        the end of what was written stops there instead of faulting in a file of holes."""
        stretches = self._data_stretches(0)
        return stretches[-1][1] if stretches else 0

    def _data_stretches(self, pos: int) -> list[tuple[int, int]]:
        """[lo, hi) stretches from ``pos`` on that may hold data (all of it where the filesystem
        cannot tell)."""
        stretches: list[tuple[int, int]] = []
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return [(pos, self.size_bytes)] if pos < self.size_bytes else []
        try:
            while pos < self.size_bytes:
                try:
                    lo = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as err:
                    if err.errno == errno.ENXIO:  # nothing but holes from pos on
                        break
                    return [*stretches, (pos, self.size_bytes)]
                hi = min(os.lseek(fd, lo, os.SEEK_HOLE), self.size_bytes)
                stretches.append((lo, hi))
                pos = hi
        finally:
            os.close(fd)
        return stretches

    def try_close(self) -> bool:
        """Unmap and close unless a reader still holds a view into the map (then retry later)."""
        if self.closed:
            return True
        self._array = None
        try:
            if self._view is not None:
                self._view.release()
                self._view = None
            self._mm.close()
        except BufferError:
            return False
        self.closed = True
        return True

    def delete(self) -> bool:
        """Unlink and close; False while a reader still holds a view: the map (and the blocks,
        which Linux frees with the last mapping) then lives on until ``try_close`` succeeds."""
        self.deleted = True
        self.path.unlink(missing_ok=True)
        return self.try_close()
