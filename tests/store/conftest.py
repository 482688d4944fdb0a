"""Fixtures of the storage tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import small_config

from gms.broker.store import MessageStore


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(store_dir: Path):
    s = MessageStore.open(store_dir, small_config())
    s.create_topic("t", 4)
    yield s
    s.close()
