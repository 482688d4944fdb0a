"""Truncation markers: what a replica cut from its queues, so that crash recovery honours it.

A replica that truncates a queue to its new leader (leader epochs, KIP-101) only cuts the
consumeQueue; the records stay in the shared commitlog. Recovery rebuilds index entries from
the commitlog, and would resurrect them. So before cutting, the store records a marker
``(queue offset, commitlog end)`` for the queue: every record of that queue with a queue offset
at or past the marker's and stored before that commitlog end was truncated. Records stored
after the marker (the new leader's, at the same offsets) are past its commitlog end and count.

One small JSON file, replaced atomically (truncations are rare: one per failover per queue).
Markers whose commitlog end is below the commitlog's first file cover nothing any more and are
dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gms.broker.atomic_file import parsing, write_atomically
from gms.private_files import make_private_dir

QueueKey = tuple[str, int]
VERSION = 1


class TruncationLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._markers: dict[QueueKey, list[tuple[int, int]]] = {}

    def __bool__(self) -> bool:
        return bool(self._markers)

    def load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._markers = {}
            return
        with parsing(self.path, "the truncation log"):
            data = json.loads(raw)
            if data.get("v") != VERSION:
                raise ValueError(f"unsupported truncation log version {data.get('v')!r}")
            self._markers = {(topic, int(q)): [(int(o), int(e)) for o, e in marks]
                             for topic, queues in data["queues"].items() for q, marks in queues.items()}

    def add(self, key: QueueKey, queue_offset: int, commitlog_end: int) -> None:
        """Record (durably, before the caller cuts anything) that ``key`` was cut at ``queue_offset``
        when the commitlog ended at ``commitlog_end``."""
        self._markers.setdefault(key, []).append((queue_offset, commitlog_end))
        self._save()

    def prune(self, commitlog_min_offset: int) -> None:
        kept = {k: [m for m in marks if m[1] > commitlog_min_offset] for k, marks in self._markers.items()}
        kept = {k: marks for k, marks in kept.items() if marks}
        if kept != self._markers:
            self._markers = kept
            self._save()

    def drop_topic(self, topic: str) -> None:
        if any(k[0] == topic for k in self._markers):
            self._markers = {k: m for k, m in self._markers.items() if k[0] != topic}
            self._save()

    def truncated(self, topic: str, queue_id: int, queue_offsets: np.ndarray, phys: np.ndarray) -> np.ndarray | None:
        """Mask of the records (of one queue) that a marker covers; None when none is."""
        marks = self._markers.get((topic, queue_id))
        if not marks:
            return None
        mask = np.zeros(len(queue_offsets), bool)
        for offset, end in marks:
            mask |= (queue_offsets >= offset) & (phys < end)
        return mask if mask.any() else None

    def _save(self) -> None:
        queues: dict[str, dict[str, list[list[int]]]] = {}
        for (topic, q), marks in self._markers.items():
            queues.setdefault(topic, {})[str(q)] = [list(m) for m in marks]
        make_private_dir(self.path.parent)
        write_atomically(self.path, json.dumps({"v": VERSION, "queues": queues}, sort_keys=True).encode())
