"""The store's health flag, and the one test seam for fsync failures.

Fail-stop (PostgreSQL's lesson from 2018): after a failed ``fdatasync`` the kernel may already
have dropped the dirty pages, so a later "successful" fsync proves nothing. The first failed data
flush therefore makes the store read-only until the broker restarts: waiting sends fail, appends
are refused, the checkpoint never moves again and close() leaves the abort marker, so the next
start scans the commitlog from the last checkpoint.
"""

from __future__ import annotations

import enum
import errno
import os
from pathlib import Path


class StoreHealth(enum.Enum):
    WRITABLE = "writable"
    READ_ONLY = "read_only"  # a flush failed: writes stop until a restart (which runs recovery)
    DISK_FULL = "disk_full"  # the last append found no disk space for its bytes or a new file (nothing lost)


def out_of_space(err: BaseException) -> bool:
    """True for a store error caused by a full disk or an exhausted quota."""
    cause = err.__cause__
    return isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)


# Tests only: while the file this variable names exists, every data flush (commitlog fdatasync)
# fails with EIO. Read once when a store opens; never set it in production.
FSYNC_FAULT_ENV = "GMS_FAULT_FSYNC_FAIL_FILE"


def fsync_fault_file() -> Path | None:
    value = os.environ.get(FSYNC_FAULT_ENV)
    return Path(value) if value else None
