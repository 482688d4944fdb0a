"""Committed offsets: saved only by a successful, fsynced write; written off the event loop;
commits for topics or queues that do not exist are refused (they would grow memory forever)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from gms.broker.offsets import OffsetStore
from gms.errors import QueueNotFoundError, TopicNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C


def test_a_failed_write_leaves_the_offsets_unsaved_until_one_succeeds(tmp_path, monkeypatch):
    path = tmp_path / "offsets.json"
    offsets = OffsetStore(path)
    offsets.commit("g", "t", 0, 5)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        offsets.persist()
    monkeypatch.setattr(os, "fsync", real_fsync)
    offsets.persist()  # the commit is still unsaved: written now
    assert OffsetStore(path).get("g", "t", 0) == 5


def test_commits_made_while_a_write_runs_are_written_by_the_next(tmp_path):
    path = tmp_path / "offsets.json"
    offsets = OffsetStore(path)
    offsets.commit("g", "t", 0, 1)
    older = offsets.snapshot()
    offsets.commit("g", "t", 0, 2)
    newer = offsets.snapshot()
    assert older is not None and newer is not None
    offsets.write(newer)
    offsets.write(older)  # late: must not replace the newer file
    assert OffsetStore(path).get("g", "t", 0) == 2
    assert offsets.snapshot() is None  # nothing left to write

    offsets.commit("g", "t", 0, 3)
    during = offsets.snapshot()
    offsets.commit("g", "t", 1, 7)  # after the snapshot: still unsaved when it is written
    assert during is not None
    offsets.write(during)
    offsets.persist()
    assert (OffsetStore(path).get("g", "t", 0), OffsetStore(path).get("g", "t", 1)) == (3, 7)


def test_persist_async_never_blocks_the_event_loop(tmp_path, monkeypatch):
    offsets = OffsetStore(tmp_path / "offsets.json")
    for queue_id in range(100):
        offsets.commit("g", "t", queue_id, queue_id)
    real_fsync = os.fsync
    in_fsync = threading.Event()

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        time.sleep(0.5)  # a slow disk: a write on the loop would stall it this long
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)

    async def scenario() -> float:
        persisting = asyncio.create_task(offsets.persist_async())
        longest, last = 0.0, time.monotonic()
        while not persisting.done():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            longest, last = max(longest, now - last), now
        await persisting
        return longest

    longest_s = asyncio.run(scenario())
    assert in_fsync.is_set()
    assert longest_s < 0.25, f"the loop stalled {longest_s:.3f} s"  # generous: the suite shares 2 cores
    assert OffsetStore(tmp_path / "offsets.json").get("g", "t", 99) == 99


def test_commits_for_unknown_topics_or_queues_are_refused(broker):
    async def scenario() -> None:
        conn = await Connection.open("127.0.0.1", broker.port)
        try:
            await conn.request(C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
            with pytest.raises(TopicNotFoundError):
                await conn.request(C.COMMIT_OFFSET, {"group": "g", "offsets": [["nope", 0, 1]]})
            with pytest.raises(QueueNotFoundError):
                await conn.request(C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 0, 1], ["orders", 2, 1]]})
            got = await conn.request(C.FETCH_OFFSET, {"group": "g", "queues": [["orders", 0], ["nope", 0]]})
            assert got.fields["offsets"] == [-1, -1]  # nothing of a refused commit was kept
            await conn.request(C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 1, 4]]})
            got = await conn.request(C.FETCH_OFFSET, {"group": "g", "queues": [["orders", 1]]})
            assert got.fields["offsets"] == [4]
        finally:
            conn.close()

    run(scenario())
