"""Small whole files of the store (JSON metadata): durable replacement -- write a temp file (0600),
fsync it, rename over, fsync the directory -- and the error for one that no longer parses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gms.broker.mapped_file import fsync_dir
from gms.errors import InvalidTopicError
from gms.private_files import open_private
from gms.store_errors import StoreCorrupt


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextmanager
def parsing(path: Path, what: str) -> Iterator[None]:
    """Errors of reading ``path``'s contents inside the block become :class:`StoreCorrupt` naming
    the file. The files are replaced atomically, so only damage (a flipped bit, an edit, a bad
    disk) makes one unreadable; the broker then refuses to start rather than guess."""
    try:
        yield
    except (ValueError, KeyError, TypeError, AttributeError, InvalidTopicError) as err:  # ValueError: JSON, UTF-8
        raise StoreCorrupt(f"{what} {path} is damaged ({err}): restore it from a backup, or see "
                           "'Damaged store files' in docs/operations.md") from err
