"""Checks of the permissions gms gives what it keeps on disk: files 0600, directories 0700."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def modes(root: Path) -> dict[str, int]:
    """Permission bits of ``root`` and of every directory and regular file under it, by path
    relative to ``root`` (directories end with ``/``)."""
    found = {"./": stat.S_IMODE(root.stat().st_mode)}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(directory, name)
            found[f"{path.relative_to(root)}/"] = stat.S_IMODE(path.lstat().st_mode)
        for name in files:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def not_private(root: Path) -> dict[str, str]:
    """What under ``root`` is not 0600 (files) or 0700 (directories), with its mode."""
    return {path: oct(mode) for path, mode in modes(root).items()
            if mode != (0o700 if path.endswith("/") else 0o600)}


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process (and the children it starts meanwhile) under ``mask``."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)
