"""Files only their owner may read: what a broker stores (messages, offsets, replication state)
and what the embedded etcd keeps (cluster metadata, users) are created 0600 in 0700 directories,
whatever the process umask, like etcd's own data directory.

A store or data directory written by an older version (files 0644, directories 0755) is
tightened when it is opened (:func:`tighten_tree`), with one warning line; a broker's store only
while its own directory is not private yet (it is tightened last).
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_OTHERS = stat.S_IRWXG | stat.S_IRWXO  # the bits a private file or directory must not have


def make_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents, each 0700. An existing directory is left as it
    is (:func:`tighten_tree` tightens the ones the caller owns)."""
    if path.is_dir():
        return
    parent = path.parent
    if parent != path:
        make_private_dir(parent)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        if path.is_dir():  # made meanwhile by another thread or process
            return
        raise
    os.chmod(path, PRIVATE_DIR_MODE)  # exactly 0700, whatever the umask took away


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with the file 0600: created so, or (an existing file,
    for example a temporary file a crash left behind) changed to it."""
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Replace the contents of ``path`` (not atomically, no fsync) in a 0600 file."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def kept_secret(path: Path) -> str:
    """The random password kept in ``path``, made (0600, in a 0700 directory) the first time."""
    if path.is_file():
        kept = path.read_text().strip()
        if kept:
            return kept
    make_private_dir(path.parent)
    password = secrets.token_urlsafe(18)
    write_private(path, password.encode() + b"\n")
    return password


def tighten_tree(root: Path) -> int:
    """Take group and other permissions away from ``root`` and everything under it: directories
    become 0700, files 0600. Symbolic links under ``root`` are neither followed nor changed (``root``
    itself may be one, to the directory meant). ``root`` is tightened last, so a private ``root``
    means an earlier walk finished (:func:`is_private_dir`). Logs one warning when anything had
    to change; returns how many entries did."""
    changed = failed = 0
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            if directory is not root and _tighten(directory, PRIVATE_DIR_MODE, os.stat(directory).st_mode):
                changed += 1
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except OSError as err:
            log.warning("cannot make %s private: %s", directory, err)
            failed += 1
            continue
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    pending.append(Path(entry.path))
                elif stat.S_ISREG(mode) and _tighten(Path(entry.path), PRIVATE_FILE_MODE, mode):
                    changed += 1
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("cannot make %s private: %s", entry.path, err)
                failed += 1
    try:
        changed += _tighten(root, PRIVATE_DIR_MODE, os.stat(root).st_mode)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("cannot make %s private: %s", root, err)
    if changed:
        log.warning("%s was readable by other users: made %d file(s) and director(ies) under it private"
                    " (files 0600, directories 0700)", root, changed)
    return changed


def is_private_dir(path: Path) -> bool:
    """Whether ``path`` is a directory only its owner may enter (False if there is none)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(mode) and not mode & _OTHERS


def _tighten(path: Path, private_mode: int, mode: int) -> bool:
    if not mode & _OTHERS:
        return False
    os.chmod(path, private_mode)
    return True
