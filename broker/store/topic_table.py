"""The store's topic table (name -> queue count and the topic's storage limits), persisted as JSON
under ``store/config/``.

In a cluster the limits come from the topic's settings in etcd (the broker copies them here, so
a restarted broker enforces them before it hears from etcd); a standalone broker takes them from
its own CREATE_TOPIC / UPDATE_TOPIC.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from gms.broker.atomic_file import parsing, write_atomically
from gms.cluster.model import (
    DEFAULT_COMPACTION,
    TopicSettings,
    check_compaction,
    check_message_size_max,
    validate_message_type,
)
from gms.errors import InvalidTopicError
from gms.naming import validate_topic_name
from gms.private_files import make_private_dir
from gms.store_errors import InvalidQueueCount, StoreIOError, TopicExists, UnknownTopic

QUEUE_COUNT_MAX = 1024  # per topic; each queue is a directory of index files
TOPICS_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """The part of a topic's settings a broker keeps itself: what the store enforces, and the
    message type its RocketMQ endpoint accepts; None = the default."""

    retention_ms: int | None = None  # None: StoreConfig.retention_hours
    message_size_bytes_max: int | None = None  # whole stored record; None: only body_size_max_bytes
    message_type: str | None = None  # gms.cluster.model.TOPIC_MESSAGE_TYPES; None: mixed
    # Compaction (docs/storage-format.md "Compacted topics"); None: delete only / the defaults
    cleanup_policy: str | None = None
    min_compaction_lag_ms: int | None = None
    dirty_ratio: float | None = None
    tombstone_retention_ms: int | None = None
    segment_roll_messages: int | None = None

    def __post_init__(self) -> None:
        if self.message_type is not None:
            validate_message_type(self.message_type)
        for name in ("retention_ms", "message_size_bytes_max"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise InvalidTopicError(f"topic setting {name} must be a positive integer")
        check_message_size_max(self.message_size_bytes_max)
        check_compaction(self.cleanup_policy, self.min_compaction_lag_ms, self.dirty_ratio,
                         self.tombstone_retention_ms, self.segment_roll_messages)

    @classmethod
    def of(cls, settings: TopicSettings) -> TopicLimits:
        """What a broker in a cluster keeps of a topic's settings."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    @property
    def compacted(self) -> bool:
        return self.cleanup_policy is not None and "compact" in self.cleanup_policy

    @property
    def expires(self) -> bool:
        """Retention by time applies (every policy but plain ``compact``)."""
        return self.cleanup_policy != "compact"

    def compaction(self, name: str) -> int | float:
        """A compaction setting, its default when unset."""
        value = getattr(self, name)
        return DEFAULT_COMPACTION[name] if value is None else value

    def merged(self, changes: Mapping[str, Any]) -> TopicLimits:
        """These limits with the named ones changed (None restores the store default)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidTopicError(f"topic setting(s) {', '.join(sorted(unknown))} need a cluster (a broker"
                                    " without a nameserver knows retention_ms, message_size_bytes_max,"
                                    " message_type and the compaction settings)")
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class _Topic:
    queue_count: int
    limits: TopicLimits
    # The commitlog end when this incarnation of the topic was created: records of the name below
    # it belong to an incarnation deleted since, and recovery never indexes them under this one.
    created_at_offset: int = 0


_LIMIT_FIELDS = tuple(f.name for f in fields(TopicLimits))


class TopicTable:
    """The topics in memory, saved whole to one JSON file.

    Any thread may change it; :meth:`persist` writes the newest state (a change made while another
    thread writes is written by the next call, so a burst of changes costs a few writes, not one
    each). A new or grown topic is visible only once the file holds it: a record stored under it
    must survive a crash recovery, which indexes only the topics of the file. A deletion is
    visible at once (nothing is stored under the topic any more) and lasting once persisted."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()  # the dicts and the version
        self._file_lock = threading.Lock()  # one writer at a time
        self._topics: dict[str, _Topic] = {}
        self._pending: dict[str, _Topic] = {}  # created or changed, visible once persisted
        self._version = 0  # counts changes; the file holds every change up to _written
        self._written = 0
        self.message_size_max = 0  # the largest message_size_bytes_max of a topic here (0: none has one)

    def load(self) -> None:
        make_private_dir(self._path.parent)
        if not self._path.exists():
            return
        with parsing(self._path, "the topic table"):
            doc = json.loads(self._path.read_bytes())
            topics = {validate_topic_name(name): _Topic(int(spec.pop("queue_count")), created_at_offset=int(
                          spec.pop("created_at_offset", 0)), limits=TopicLimits(**spec))
                      for name, spec in doc["topics"].items()}
        self._set(topics)

    def _set(self, topics: dict[str, _Topic]) -> None:
        self._topics = topics
        self.message_size_max = max((t.limits.message_size_bytes_max or 0 for t in topics.values()), default=0)

    def persist(self) -> None:
        """Write the table (pending changes included) unless the file already holds every change
        made so far. Raises StoreIOError (a full disk): the changes stay pending, the next call
        writes them."""
        with self._file_lock:
            with self._lock:
                version = self._version
                if version == self._written:
                    return
                topics = {**self._topics, **self._pending}
            doc = {"version": TOPICS_FORMAT_VERSION,
                   "topics": {name: {"queue_count": t.queue_count, "created_at_offset": t.created_at_offset,
                                     **{k: getattr(t.limits, k) for k in _LIMIT_FIELDS
                                        if getattr(t.limits, k) is not None}}
                              for name, t in sorted(topics.items())}}
            try:
                write_atomically(self._path, json.dumps(doc, separators=(",", ":")).encode())
            except OSError as err:  # a full disk: a clear, retriable error
                raise StoreIOError(f"cannot save the topic table {self._path}: {err}") from err
            self._written = version

    def _change(self, changed: Mapping[str, _Topic], *, new: bool = False) -> None:
        """Save ``changed``, then show it; on a failed save, drop it. ``new``: TopicExists if one
        of them is here already (or on its way); else UnknownTopic if one was removed meanwhile."""
        with self._lock:
            for name in changed:
                if new and (name in self._topics or name in self._pending):
                    raise TopicExists(name)
                if not new and name not in self._topics:
                    raise UnknownTopic(name)
            self._pending.update(changed)
            self._version += 1
        try:
            self.persist()
        except BaseException:
            with self._lock:
                for name in changed:
                    self._pending.pop(name, None)
                self._version += 1  # the next write leaves them out
            raise
        with self._lock:
            self._set({**self._topics, **{name: self._pending.pop(name) for name in changed}})

    @staticmethod
    def _check_count(queue_count: int) -> None:
        if not isinstance(queue_count, int) or not 1 <= queue_count <= QUEUE_COUNT_MAX:
            raise InvalidQueueCount(queue_count, QUEUE_COUNT_MAX)

    def create(self, name: str, queue_count: int, limits: TopicLimits | None = None,
               created_at_offset: int = 0) -> None:
        self.create_many({name: (queue_count, limits or TopicLimits())}, created_at_offset)

    def create_many(self, topics: Mapping[str, tuple[int, TopicLimits]], created_at_offset: int = 0) -> None:
        """Create every topic of ``topics`` (name: (queue count, limits)) in one save of the
        table, all or none."""
        for name, (queue_count, _) in topics.items():
            validate_topic_name(name)
            self._check_count(queue_count)
        self._change({name: _Topic(queue_count, limits, created_at_offset)
                      for name, (queue_count, limits) in topics.items()}, new=True)

    def update(self, name: str, queue_count: int | None = None, limits: TopicLimits | None = None) -> None:
        """Change the queue count and/or the limits; saved only if something changed."""
        if queue_count is not None:
            self._check_count(queue_count)
        current = self._entry(name)
        updated = replace(current, queue_count=current.queue_count if queue_count is None else queue_count,
                          limits=current.limits if limits is None else limits)
        if updated != current:
            self._change({name: updated})

    def remove(self, names: Iterable[str]) -> dict[str, int]:
        """Drop the named topics from memory at once (name: its queue count); :meth:`persist`
        makes it lasting. Raises UnknownTopic, removing none, if one is not here."""
        with self._lock:
            counts = {name: self._entry(name).queue_count for name in names}
            self._set({k: v for k, v in self._topics.items() if k not in counts})
            self._version += 1
        return counts

    def _entry(self, name: str) -> _Topic:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopic(name) from None

    def queue_count(self, name: str) -> int:
        return self._entry(name).queue_count

    def limits(self, name: str) -> TopicLimits:
        return self._entry(name).limits

    def get(self, name: str) -> int | None:
        topic = self._topics.get(name)
        return None if topic is None else topic.queue_count

    def created_at_offset(self, name: str) -> int:
        """0 for a topic unknown here (its records are not indexed anyway)."""
        topic = self._topics.get(name)
        return 0 if topic is None else topic.created_at_offset

    def snapshot(self) -> dict[str, int]:
        return {name: t.queue_count for name, t in self._topics.items()}

    def all_limits(self) -> dict[str, TopicLimits]:
        return {name: t.limits for name, t in self._topics.items()}
