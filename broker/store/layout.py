"""The store's fixed geometry, recorded when the store is created.

Commitlog file size and consumeQueue entries per file decide where every byte lives, so they
cannot change under existing data: a store opened with other values would misread (or, worse,
resize) its files. ``store/config/layout.json`` keeps the values the store was created with;
opening with different ones is refused with a message that says what to do. ``gms-broker`` and
``gms standalone`` take an existing store's values when none are given (see
:func:`gms.broker.config.load_config`), so only a contradiction is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from gms.broker.atomic_file import parsing, write_atomically
from gms.broker.store_config import StoreConfig
from gms.private_files import make_private_dir
from gms.store_errors import StoreLayoutMismatch

LAYOUT_VERSION = 1
_FIELDS = ("commitlog_file_size_bytes", "cq_entries_per_file")


def read_layout(path: Path) -> dict[str, int] | None:
    """The geometry an existing store was created with (``StorePaths.layout``); None for a new store."""
    if not path.exists():
        return None
    with parsing(path, "the store layout"):
        recorded = json.loads(path.read_bytes())
        return {name: recorded.get(name) for name in _FIELDS}


def check_layout(path: Path, config: StoreConfig) -> None:
    """Record the geometry of a new store, or check that ``config`` matches an existing one."""
    wanted = {name: getattr(config, name) for name in _FIELDS}
    recorded = read_layout(path)
    if recorded is None:
        make_private_dir(path.parent)
        write_atomically(path, json.dumps({"version": LAYOUT_VERSION, **wanted}, indent=1).encode())
        return
    wrong = {name: recorded.get(name) for name in _FIELDS if recorded.get(name) != wanted[name]}
    if wrong:
        settings = ", ".join(f"{name} = {value}" for name, value in wrong.items())
        raise StoreLayoutMismatch(
            f"the store in {path.parent.parent} was created with {settings}; these cannot change under"
            " existing data: leave out gms-broker --commitlog-file-size / --cq-file-entries (and the [store]"
            " table's) to use the store's own, or give the same"
        )
