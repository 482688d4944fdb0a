"""Committed consumer-group offsets, kept in memory and persisted to one JSON file.

The file is rewritten atomically (temp file, fsync, rename) by :meth:`persist`,
which the broker calls periodically and on shutdown; a crash loses at most the
commits since the last persist, which consumers then see again (at-least-once).

Replication: every commit gets a sequence number of this store's ``session`` (a random id per
process), so a queue's leader can send a follower only the commits it has not seen yet
(:meth:`changed_since`); the follower stores them with :meth:`commit` like its own, so the
group's position survives the leader's loss.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

_FORMAT_VERSION = 1
SESSION_BITS = 62  # a positive msgpack int; 0 means "no session seen yet" on the wire


class OffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        # group -> topic -> queue id -> next offset to consume
        self._offsets: dict[str, dict[str, dict[int, int]]] = {}
        self._dirty = False
        self.session = secrets.randbits(SESSION_BITS) | 1
        self.seq = 0  # sequence number of the latest commit in this session
        # (topic, queue id) -> group -> seq of its latest commit (this session only)
        self._commit_seqs: dict[tuple[str, int], dict[str, int]] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        data = json.loads(self.path.read_text())
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"{self.path}: unknown offsets file version {data.get('version')!r}")
        self._offsets = {
            group: {topic: {int(q): int(o) for q, o in queues.items()} for topic, queues in topics.items()}
            for group, topics in data["offsets"].items()
        }
        # Loaded commits count as seq 1: a follower that never fetched from us gets them all.
        self.seq = 1
        for group, topics in self._offsets.items():
            for topic, queues in topics.items():
                for queue_id in queues:
                    self._commit_seqs.setdefault((topic, queue_id), {})[group] = 1

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._offsets.setdefault(group, {}).setdefault(topic, {})[queue_id] = offset
        self.seq += 1
        self._commit_seqs.setdefault((topic, queue_id), {})[group] = self.seq
        self._dirty = True

    def changed_since(self, topic: str, queue_id: int, seq: int) -> list[list[str | int]]:
        """``[group, offset]`` of every group whose commit on the queue is newer than ``seq`` of
        this session (seq 0: every group known here, loaded from the file or committed)."""
        seqs = self._commit_seqs.get((topic, queue_id))
        if not seqs or self.seq <= seq:
            return []
        return [[group, self._offsets[group][topic][queue_id]] for group, s in seqs.items() if s > seq]

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get(group, {}).get(topic, {}).get(queue_id)

    def group_offsets(self, group: str) -> dict[str, dict[int, int]]:
        return {topic: dict(queues) for topic, queues in self._offsets.get(group, {}).items()}

    def groups(self) -> list[str]:
        return sorted(self._offsets)

    def delete_topic(self, topic: str) -> None:
        for topics in self._offsets.values():
            if topics.pop(topic, None) is not None:
                self._dirty = True
        for key in [k for k in self._commit_seqs if k[0] == topic]:
            del self._commit_seqs[key]

    def persist(self) -> None:
        """Write the offsets if anything changed since the last write."""
        if not self._dirty:
            return
        self._dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        payload = {"version": _FORMAT_VERSION, "offsets": self._offsets}
        with open(tmp, "w") as out:
            json.dump(payload, out, separators=(",", ":"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
