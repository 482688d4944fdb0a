"""DiskUsage: the store's ``du``, walked when first asked, then on a thread once it is old."""

from __future__ import annotations

import time

from gms.broker.mapped_file import tree_disk_bytes
from gms.broker.store.disk_usage import DiskUsage, du_bytes


def test_the_first_ask_walks_later_ones_answer_the_last_walk_until_it_is_old(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100_000)
    usage = DiskUsage(tmp_path, max_age_s=0.2)
    first = usage.bytes()
    assert first == tree_disk_bytes(tmp_path) > 0
    (tmp_path / "b").write_bytes(b"x" * 1_000_000)
    assert usage.bytes() == first  # young: no walk
    time.sleep(0.25)
    assert usage.bytes() == first  # old: this ask starts a walk on a thread and answers the last figure
    deadline = time.monotonic() + 10
    while usage.bytes() == first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert usage.bytes() == tree_disk_bytes(tmp_path) > first + 900_000


def test_the_walk_is_du_s_and_python_walks_where_du_cannot_run(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"x" * 300_000)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"x" * 50_000)
    assert du_bytes(tmp_path) == tree_disk_bytes(tmp_path) > 350_000
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no du to run
    assert du_bytes(tmp_path) == tree_disk_bytes(tmp_path)
    assert du_bytes(tmp_path / "gone") == 0
