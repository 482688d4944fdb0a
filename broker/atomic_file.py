"""Durable whole-file replacement: write a temp file (0600), fsync it, rename over, fsync the
directory."""

from __future__ import annotations

import os
from pathlib import Path

from gms.broker.mapped_file import fsync_dir
from gms.private_files import open_private


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
