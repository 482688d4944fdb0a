"""Where a follower keeps the records its leaders stored: message ids resolvable on any replica.

A message id names the broker that stored the record and the record's commitlog offset there
(:mod:`gms.msgid`). A follower stores the same bytes at offsets of its own, so after a failover
the id's broker may be gone while its copies live on. A follower therefore notes, for every run
of records it appends that lay back to back in its leader's commitlog and lands back to back in
its own, one entry: (leader, leader offset, local offset, length). A record of the run at leader
offset P is at local offset ``local + (P - leader offset)``. A replicated append is one or a few
runs (a fetch serves each queue's adjacent records as one view), so this costs a few numpy
operations and 32 bytes per run, not per message.

Entries go to one append-only file per commitlog file (named like it, holding the runs whose
local start lies in it), synced with the store checkpoint and deleted with their commitlog file.
A lookup scans the files with numpy, newest first; its caller checks what it finds (a record
starts there, its queue still holds it), so entries of truncated or lost records do no harm.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import xxhash

from gms.msgid import decode_msg_id, encode_msg_id
from gms.private_files import make_private_dir, open_private

log = logging.getLogger(__name__)

ENTRY_DTYPE = np.dtype([("leader", ">i8"), ("leader_phys", ">i8"), ("local_phys", ">i8"), ("length", ">i8")])
_NAME_DIGITS = 20


def leader_key(address: str) -> int:
    """A leader's address as message ids spell it ("ip:port"), hashed to an int64."""
    host, port = address.rsplit(":", 1)
    canonical = decode_msg_id(encode_msg_id(host.strip("[]"), int(port), 0)).address
    return xxhash.xxh64_intdigest(canonical.encode()) - (1 << 63)


def runs(leader_phys: np.ndarray, local_phys: np.ndarray, sizes: np.ndarray, leader: int) -> np.ndarray:
    """The entries of records appended in order: one per run contiguous on both sides."""
    n = len(sizes)
    step = sizes[:-1]
    breaks = np.flatnonzero((np.diff(leader_phys) != step) | (np.diff(local_phys) != step)) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks, [n])) - 1
    entries = np.empty(len(first), ENTRY_DTYPE)
    entries["leader"] = leader
    entries["leader_phys"] = leader_phys[first]
    entries["local_phys"] = local_phys[first]
    entries["length"] = leader_phys[last] + sizes[last] - leader_phys[first]
    return entries


class OriginMap:
    """The runs a follower appended, by local commitlog file. Written under the store's write lock."""

    def __init__(self, directory: Path, commitlog_file_size: int) -> None:
        self.directory = directory
        self._file_size = commitlog_file_size  # commitlog files start at multiples of it
        self._fds: dict[int, int] = {}  # commitlog file base -> open descriptor (append)
        self._lock = threading.Lock()  # sync and delete (flush thread, housekeeper) against appends
        make_private_dir(directory)

    def add(self, entries: np.ndarray) -> None:
        local = entries["local_phys"].astype(np.int64)
        bases = local - local % self._file_size
        with self._lock:
            for base in np.unique(bases).tolist():
                fd = self._fds.get(base)
                if fd is None:
                    fd = self._fds[base] = open_private(self._path(base), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(fd, entries[bases == base].tobytes())

    def find(self, leader: int, leader_phys: int) -> list[int]:
        """Local offsets that may hold the record at ``leader_phys`` of ``leader``, newest first."""
        found: list[int] = []
        try:
            paths = sorted(self.directory.iterdir(), reverse=True)
        except OSError as err:  # a lookup aid: an unreadable map answers nothing, the records are intact
            log.warning("cannot read the origin map %s: %s", self.directory, err)
            return found
        for path in paths:
            if not path.name.isdigit():
                continue
            try:
                entries = np.fromfile(path, ENTRY_DTYPE, count=path.stat().st_size // ENTRY_DTYPE.itemsize)
            except OSError:
                continue
            hit = ((entries["leader"] == leader) & (entries["leader_phys"] <= leader_phys)
                   & (leader_phys < entries["leader_phys"] + entries["length"]))
            for k in np.flatnonzero(hit)[::-1].tolist():
                found.append(int(entries["local_phys"][k]) + leader_phys - int(entries["leader_phys"][k]))
        return found

    def sync(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.fdatasync(fd)

    def delete_below(self, min_phys: int) -> None:
        """Drop the files of commitlog files retention deleted (those starting below ``min_phys``)."""
        with self._lock:
            for path in self.directory.iterdir():
                if path.name.isdigit() and int(path.name) < min_phys:
                    fd = self._fds.pop(int(path.name), None)
                    if fd is not None:
                        os.close(fd)
                    path.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def _path(self, base: int) -> Path:
        return self.directory / f"{base:0{_NAME_DIGITS}d}"
