"""Committed consumer-group offsets, kept in memory and persisted to one JSON file.

The file is rewritten atomically (temp file, fsync, rename) by :meth:`persist`,
which the broker calls periodically and on shutdown; a crash loses at most the
commits since the last persist, which consumers then see again (at-least-once).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

_FORMAT_VERSION = 1


class OffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        # group -> topic -> queue id -> next offset to consume
        self._offsets: dict[str, dict[str, dict[int, int]]] = {}
        self._dirty = False
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

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._offsets.setdefault(group, {}).setdefault(topic, {})[queue_id] = offset
        self._dirty = True

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
