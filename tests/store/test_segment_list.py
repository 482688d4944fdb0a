"""SegmentList: the mapped files of one directory (commitlog, each consumeQueue): loading with
hole trimming, lookup, deletion of files a reader still holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from gms.broker.mapped_file import MappedFile, file_name
from gms.broker.segment_list import SegmentList
from gms.store_errors import StoreInvariantBroken, StoreIOError

SIZE = 4096


def segments_with(directory: Path, count: int) -> SegmentList:
    """A list of ``count`` files, each starting with its own index as a marker byte."""
    directory.mkdir(parents=True, exist_ok=True)
    segments = SegmentList(directory, SIZE, [])
    for i in range(count):
        f = segments.create(i * SIZE)
        f.write(0, bytes([i + 1]))
        segments.append(f)
    return segments


def test_load_maps_the_newest_contiguous_run_and_leaves_older_files_on_disk(tmp_path):
    segments_with(tmp_path, 5).close()
    (tmp_path / file_name(2 * SIZE)).unlink()  # a hole, as a file deleted by hand leaves
    (tmp_path / "not-a-segment").write_bytes(b"x")
    segments = SegmentList.load(tmp_path, SIZE)
    assert [f.base_offset for f in segments.files] == [3 * SIZE, 4 * SIZE]
    assert [f.view[0] for f in segments.files] == [4, 5]
    assert (tmp_path / file_name(0)).exists() and (tmp_path / file_name(SIZE)).exists()
    assert segments.file_for(4 * SIZE + 100) is segments.files[1]
    assert segments.file_for(3 * SIZE) is segments.files[0]
    assert segments.file_for(3 * SIZE - 1) is None and segments.file_for(5 * SIZE) is None
    segments.close()
    assert all(f.closed for f in segments.files)


def test_a_missing_directory_is_an_empty_list_made_with_its_first_file(tmp_path):
    segments = SegmentList.load(tmp_path / "a" / "b", SIZE)
    assert segments.files == [] and segments.file_for(0) is None
    assert not (tmp_path / "a").exists()  # an empty queue costs no disk
    f = segments.create(0)
    segments.append(f)
    assert f.path.parent == tmp_path / "a" / "b" and f.path.exists()
    segments.close()


def test_delete_oldest_deletes_a_held_file_at_once_and_closes_it_once_released(tmp_path):
    segments = segments_with(tmp_path, 4)
    held_file = segments.files[0]
    snapshot = segments.files  # what a reader took before retention ran
    held = held_file.view[0:10]  # a response still in a socket buffer
    assert segments.delete_oldest(lambda f: True) == 3  # never the last one
    assert [f.base_offset for f in segments.files] == [3 * SIZE]
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(3 * SIZE)]  # all unlinked
    assert segments.closing == [held_file] and not held_file.closed
    assert all(f.closed for f in snapshot[1:3])
    assert held[0] == 1 and snapshot[0].view[0] == 1  # the held map and the snapshot still read
    held_file.flush()  # the flush thread meeting a deleted file: nothing to make durable
    del held
    segments.close_released()
    assert segments.closing == [] and held_file.closed


def test_delete_oldest_stops_at_the_first_file_to_keep(tmp_path):
    segments = segments_with(tmp_path, 4)
    assert segments.delete_oldest(lambda f: f.base_offset != SIZE) == 1
    assert [f.base_offset for f in segments.files] == [SIZE, 2 * SIZE, 3 * SIZE]
    assert segments.delete_oldest(lambda f: True, keep=2) == 1
    assert [f.base_offset for f in segments.files] == [2 * SIZE, 3 * SIZE]
    segments.close()


def test_delete_from_takes_the_later_files_and_a_new_file_may_reuse_a_held_ones_name(tmp_path):
    segments = segments_with(tmp_path, 3)
    held_file = segments.files[2]
    held = held_file.view[0:1]
    segments.delete_from(SIZE)
    assert [f.base_offset for f in segments.files] == [0]
    assert segments.closing == [held_file] and not (tmp_path / file_name(2 * SIZE)).exists()
    segments.append(segments.create(SIZE))
    segments.append(segments.create(2 * SIZE))  # the held file's name: its old inode is gone
    assert segments.files[2].view[0] == 0 and held[0] == 3
    segments.close()  # the held file stays mapped, and closes at a later try once released
    assert segments.closing == [held_file]
    del held
    segments.close_released()
    assert held_file.closed


def test_take_from_hands_back_the_later_files_without_deleting_them(tmp_path):
    segments = segments_with(tmp_path, 3)
    taken = segments.take_from(SIZE + 1)
    assert [f.base_offset for f in taken] == [2 * SIZE] and not taken[0].closed and taken[0].path.exists()
    assert [f.base_offset for f in segments.files] == [0, SIZE]
    stray = segments.create(3 * SIZE)
    with pytest.raises(StoreInvariantBroken, match="does not follow"):  # files stay contiguous
        segments.append(stray)
    assert stray.delete()
    segments.append(taken[0])
    segments.close()


def test_flush_of_a_file_gone_without_being_deleted_is_an_error(tmp_path):
    f = MappedFile.create(tmp_path, 0, SIZE)
    f.path.unlink()
    with pytest.raises(StoreIOError, match="fdatasync"):
        f.flush()
    assert f.try_close()
