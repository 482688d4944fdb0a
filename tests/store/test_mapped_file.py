"""MappedFile.zero_from, the recovery truncation: it must erase every byte from the cut, whether
the bytes reached the disk or only the page cache, yet skip what the filesystem knows is empty."""

from __future__ import annotations

import os

import pytest

from gms.broker.mapped_file import ZERO_CHUNK_BYTES, MappedFile

SIZE = 8 * ZERO_CHUNK_BYTES


@pytest.fixture
def mapped(tmp_path):
    f = MappedFile.create(tmp_path, 0, SIZE)
    yield f
    f.try_close()


@pytest.mark.parametrize("flushed", [True, False])
def test_zero_from_erases_data_in_the_map_and_on_disk(mapped, flushed):
    spots = [10, ZERO_CHUNK_BYTES - 1, 3 * ZERO_CHUNK_BYTES + 5, SIZE - 1]
    for spot in spots:
        mapped.array[spot] = 0x5A
    if flushed:
        mapped.flush()
    mapped.zero_from(ZERO_CHUNK_BYTES - 1)
    assert mapped.array[10] == 0x5A  # before the cut: kept
    assert not mapped.array[ZERO_CHUNK_BYTES - 1:].any()
    with open(mapped.path, "rb") as fh:  # and what a fresh reader of the file sees
        fh.seek(ZERO_CHUNK_BYTES - 1)
        assert not any(fh.read())


def test_zero_from_writes_nothing_to_an_empty_file(mapped):
    before = os.stat(mapped.path).st_mtime_ns
    mapped.zero_from(0)
    assert os.stat(mapped.path).st_mtime_ns == before and not mapped.array.any()


def test_warming_waits_while_asked_and_gives_up_once_stopped(mapped, monkeypatch):
    monkeypatch.setattr("gms.broker.mapped_file.WARM_PAUSE_S", 0.001)
    asked = []
    mapped.warm(wait=lambda: len(asked) < 3 and not asked.append(1))  # busy twice, then free
    assert len(asked) == 3
    reads = []
    monkeypatch.setattr("gms.broker.mapped_file.os.preadv", lambda *args: reads.append(args))
    waits = []
    mapped.warm(stop=lambda: len(waits) >= 5, wait=lambda: not waits.append(1))  # busy until stopped
    assert len(waits) == 5 and reads == []
