"""The store's topic table (name -> queue count), persisted as JSON under ``store/config/``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from gms.broker.atomic_file import write_atomically
from gms.naming import validate_topic_name
from gms.store_errors import InvalidQueueCount, StoreCorrupt, TopicExists, UnknownTopic

QUEUE_COUNT_MAX = 1024  # per topic; each queue is a directory of index files
TOPICS_FILE = "topics.json"
TOPICS_FORMAT_VERSION = 1


class TopicTable:
    def __init__(self, config_dir: Path) -> None:
        self._path = config_dir / TOPICS_FILE
        self._lock = threading.Lock()
        self._queue_counts: dict[str, int] = {}

    def load(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if not self._path.exists():
            return
        try:
            doc = json.loads(self._path.read_bytes())
            counts = {validate_topic_name(name): int(spec["queue_count"]) for name, spec in doc["topics"].items()}
        except (ValueError, KeyError, TypeError) as err:
            raise StoreCorrupt(f"unreadable topic table {self._path}: {err}") from err
        self._queue_counts = counts

    def _save(self, counts: dict[str, int]) -> None:
        doc = {"version": TOPICS_FORMAT_VERSION,
               "topics": {name: {"queue_count": n} for name, n in sorted(counts.items())}}
        write_atomically(self._path, json.dumps(doc, indent=1).encode())
        self._queue_counts = counts

    @staticmethod
    def _check_count(queue_count: int) -> None:
        if not isinstance(queue_count, int) or not 1 <= queue_count <= QUEUE_COUNT_MAX:
            raise InvalidQueueCount(queue_count, QUEUE_COUNT_MAX)

    def create(self, name: str, queue_count: int) -> None:
        validate_topic_name(name)
        self._check_count(queue_count)
        with self._lock:
            if name in self._queue_counts:
                raise TopicExists(name)
            self._save({**self._queue_counts, name: queue_count})

    def update(self, name: str, queue_count: int) -> None:
        self._check_count(queue_count)
        with self._lock:
            self.queue_count(name)
            self._save({**self._queue_counts, name: queue_count})

    def delete(self, name: str) -> None:
        with self._lock:
            self.queue_count(name)
            self._save({k: v for k, v in self._queue_counts.items() if k != name})

    def queue_count(self, name: str) -> int:
        try:
            return self._queue_counts[name]
        except KeyError:
            raise UnknownTopic(name) from None

    def get(self, name: str) -> int | None:
        return self._queue_counts.get(name)

    def snapshot(self) -> dict[str, int]:
        return dict(self._queue_counts)
