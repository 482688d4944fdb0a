"""Offsets of a broadcasting consumer, kept by the consumer itself (RocketMQ's
``LocalFileOffsetStore``).

Every broadcasting member reads every queue, so the group's offsets on the broker would be
overwritten by each member in turn; instead each consumer instance keeps its own in one JSON
file, ``<directory>/<group>/<instance>.json``, written atomically (temporary file, fsync,
rename) on every commit. A consumer restarted with the same ``instance_name`` resumes there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from gms.client.fetcher import TopicQueue

DEFAULT_OFFSET_DIR = Path("~/.gms/offsets")


class LocalOffsetStore:
    def __init__(self, directory: Path | str, group: str, instance: str) -> None:
        for kind, name in (("group", group), ("instance name", instance)):
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"{kind} {name!r} cannot name a file")
        self.path = Path(directory).expanduser() / group / f"{instance}.json"
        self._offsets: dict[TopicQueue, int] = {}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            self._offsets = {TopicQueue(topic, int(q)): int(offset)
                             for topic, queues in saved["offsets"].items() for q, offset in queues.items()}

    def get(self, queue: TopicQueue) -> int | None:
        return self._offsets.get(queue)

    def commit(self, offsets: Mapping[TopicQueue, int]) -> None:
        """Merge ``offsets`` in and write the file (atomically)."""
        self._offsets.update(offsets)
        nested: dict[str, dict[str, int]] = {}
        for (topic, queue_id), offset in sorted(self._offsets.items()):
            nested.setdefault(topic, {})[str(queue_id)] = offset
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        with open(temporary, "w") as out:
            json.dump({"offsets": nested}, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
