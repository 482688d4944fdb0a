"""Committed consumer-group offsets, kept in memory and persisted to one JSON file.

The file is rewritten atomically (temp file, fsync, rename, directory fsync): the broker takes a
:meth:`snapshot` on its event loop and writes it in a worker thread (:meth:`persist_async`,
periodically), and calls :meth:`persist` on shutdown. The offsets count as saved only once a
write succeeded; a crash loses at most the commits since the last one, which consumers then see
again (at-least-once).

Replication: every commit gets a sequence number of this store's ``session`` (a random id per
process), so a queue's leader can send a follower only the commits it has not seen yet
(:meth:`changed_since`); the follower stores them (:meth:`apply_replicated`), so the group's
position survives the leader's loss. A deleted offset (``gms group delete``) is a commit of
:data:`DELETED` with its own seq, so followers delete it too; and an answer to a fetch that
started a new session holds every group the leader has on the queue, so a follower that missed
the deletes (down, or the leader restarted) drops what the leader no longer has.

Pop consumption (broker.pop) commits its groups' positions here too, each with its *pop state*
attached (what is in flight above the committed offset): the state is written to the file and
sent to followers with the commit, so it survives restarts and follows leadership. A live
state (the leader's own) is turned into its wire form only when written or sent.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from gms.broker.atomic_file import parsing, write_atomically
from gms.private_files import make_private_dir
from gms.protocol.replication import GroupCommit

_FORMAT_VERSION = 1
SESSION_BITS = 62  # a positive msgpack int; 0 means "no session seen yet" on the wire
DELETED = -1  # the offset of a [group, offset] commit row whose group's offset was deleted

Offsets = dict[str, dict[str, dict[int, int]]]  # group -> topic -> queue id -> next offset to consume
PopWire = list[Any]  # a pop state's wire and file form (broker.pop.PopQueue.wire)
PopStates = dict[str, dict[str, dict[int, PopWire]]]  # group -> topic -> queue id -> pop state


class LivePopState(Protocol):
    def wire(self) -> PopWire: ...


PopState = LivePopState | PopWire


class OffsetsSnapshot(NamedTuple):
    version: int  # the store's change count when taken
    offsets: Offsets
    pop: PopStates


def _wire(state: PopState) -> PopWire:
    return state if isinstance(state, list) else state.wire()


class OffsetStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: Offsets = {}
        self._pop: dict[tuple[str, str, int], PopState] = {}  # (group, topic, queue id) -> pop state
        self._version = 0  # counts changes; the file holds those up to _written_version
        self._written_version = 0
        self._file_lock = threading.Lock()  # one writer of the file at a time
        self.session = secrets.randbits(SESSION_BITS) | 1
        self.seq = 0  # sequence number of the latest commit in this session
        # (topic, queue id) -> group -> seq of its latest commit (this session only)
        self._commit_seqs: dict[tuple[str, int], dict[str, int]] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        with parsing(self.path, "the consumer offsets file"):
            data = json.loads(self.path.read_bytes())
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"unknown offsets file version {data.get('version')!r}")
            self._offsets = {
                group: {topic: {int(q): int(o) for q, o in queues.items()} for topic, queues in topics.items()}
                for group, topics in data["offsets"].items()
            }
            self._pop = {(group, topic, int(q)): state for group, topics in data.get("pop", {}).items()
                         for topic, queues in topics.items() for q, state in queues.items()
                         if self.get(group, topic, int(q)) is not None}
        # Loaded commits count as seq 1: a follower that never fetched from us gets them all.
        self.seq = 1
        for group, topics in self._offsets.items():
            for topic, queues in topics.items():
                for queue_id in queues:
                    self._commit_seqs.setdefault((topic, queue_id), {})[group] = 1

    def commit(self, group: str, topic: str, queue_id: int, offset: int, pop: PopState | None = None) -> None:
        """Commit ``offset``, with the group's pop state on the queue (None: it has none; an
        ordinary commit or a reset ends pop state)."""
        self._offsets.setdefault(group, {}).setdefault(topic, {})[queue_id] = offset
        if pop is None:
            self._pop.pop((group, topic, queue_id), None)
        else:
            self._pop[group, topic, queue_id] = pop
        self._changed(group, topic, queue_id)

    def pop_state(self, group: str, topic: str, queue_id: int) -> PopState | None:
        """The pop state committed with the group's offset on the queue (None: none)."""
        return self._pop.get((group, topic, queue_id))

    def _changed(self, group: str, topic: str, queue_id: int) -> None:
        self.seq += 1
        self._commit_seqs.setdefault((topic, queue_id), {})[group] = self.seq
        self._version += 1

    def _remove(self, group: str, topic: str, queue_id: int) -> None:
        """Forget one committed offset (and the group once it has none) and record it as a
        change, so followers delete it too."""
        topics = self._offsets[group]
        del topics[topic][queue_id]
        self._pop.pop((group, topic, queue_id), None)
        if not topics[topic]:
            del topics[topic]
        if not topics:
            del self._offsets[group]
        self._changed(group, topic, queue_id)

    def delete_group(self, group: str) -> list[tuple[str, int]]:
        """Delete every offset ``group`` committed here; return the queues it had committed on."""
        queues = [(topic, q) for topic, offsets in self._offsets.get(group, {}).items() for q in offsets]
        for topic, queue_id in queues:
            self._remove(group, topic, queue_id)
        return queues

    def delete_offsets(self, group: str, queues: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """Delete ``group``'s committed offsets of ``queues`` here; return those it had."""
        had = [(topic, queue_id) for topic, queue_id in queues if self.get(group, topic, queue_id) is not None]
        for topic, queue_id in had:
            self._remove(group, topic, queue_id)
        return had

    def changed_since(self, topic: str, queue_id: int, seq: int) -> list[GroupCommit]:
        """The commit of every group whose commit on the queue is newer than ``seq`` of this
        session (seq 0: every group known here, loaded from the file or committed), with its pop
        state if it has one; ``offset`` is :data:`DELETED` for a group whose offset was deleted since."""
        seqs = self._commit_seqs.get((topic, queue_id))
        if not seqs or self.seq <= seq:
            return []
        rows: list[GroupCommit] = []
        for group, s in seqs.items():
            if s > seq:
                pop = self._pop.get((group, topic, queue_id))
                rows.append(GroupCommit(group, self._offsets.get(group, {}).get(topic, {}).get(queue_id, DELETED),
                                        None if pop is None else _wire(pop)))
        return rows

    def apply_replicated(self, topic: str, queue_id: int, commits: Iterable[GroupCommit], *,
                         complete: bool) -> None:
        """Store the commits a queue's leader sent (:meth:`changed_since`). ``complete``: they
        answer a fetch from seq 0 of the leader's session, so they name every group the leader
        has on the queue — groups missing from them were deleted there."""
        sent: set[str] = set()
        for row in commits:
            group = row.group
            sent.add(group)
            if row.offset != DELETED:
                self.commit(group, topic, queue_id, row.offset, row.pop)
            elif self.get(group, topic, queue_id) is not None:
                self._remove(group, topic, queue_id)
        if complete:
            for group in [g for g, topics in self._offsets.items()
                          if queue_id in topics.get(topic, {}) and g not in sent]:
                self._remove(group, topic, queue_id)

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get(group, {}).get(topic, {}).get(queue_id)

    def group_offsets(self, group: str) -> dict[str, dict[int, int]]:
        return {topic: dict(queues) for topic, queues in self._offsets.get(group, {}).items()}

    def groups(self) -> list[str]:
        return sorted(self._offsets)

    def delete_topic(self, topic: str) -> None:
        self.delete_topics([topic])

    def delete_topics(self, names: Iterable[str]) -> None:
        """Forget every offset committed on the named topics (one pass, however many)."""
        topics = set(names)
        for pop_key in [k for k in self._pop if k[1] in topics]:
            del self._pop[pop_key]
        for group, committed in list(self._offsets.items()):
            dropped = topics & committed.keys()
            if dropped:
                for topic in dropped:
                    del committed[topic]
                self._version += 1
                if not committed:
                    del self._offsets[group]
        for key in [k for k in self._commit_seqs if k[0] in topics]:
            del self._commit_seqs[key]

    def snapshot(self) -> OffsetsSnapshot | None:
        """(On the thread that commits.) A copy of the offsets to write, None if the file is
        up to date."""
        if self._version == self._written_version:
            return None
        pop: PopStates = {}
        for (group, topic, queue_id), state in self._pop.items():
            pop.setdefault(group, {}).setdefault(topic, {})[queue_id] = _wire(state)
        return OffsetsSnapshot(self._version, {
            group: {topic: dict(queues) for topic, queues in topics.items()}
            for group, topics in self._offsets.items()}, pop)

    def write(self, snapshot: OffsetsSnapshot) -> None:
        """(Any thread.) Replace the file with ``snapshot`` unless a newer one was written; the
        changes it holds count as saved only after the write and its fsyncs succeeded (a failure
        raises, and the next persist tries again)."""
        with self._file_lock:
            if snapshot.version <= self._written_version:
                return
            make_private_dir(self.path.parent)
            payload: dict[str, Any] = {"version": _FORMAT_VERSION, "offsets": snapshot.offsets}
            if snapshot.pop:
                payload["pop"] = snapshot.pop
            write_atomically(self.path, json.dumps(payload, separators=(",", ":")).encode())
            self._written_version = snapshot.version

    def persist(self) -> None:
        """Write the offsets now if anything changed since the last write (shutdown, tests)."""
        snapshot = self.snapshot()
        if snapshot is not None:
            self.write(snapshot)

    async def persist_async(self) -> None:
        """:meth:`persist` with the JSON encoding and the fsyncs in a worker thread, so the
        event loop never stalls on them."""
        snapshot = self.snapshot()
        if snapshot is not None:
            await asyncio.to_thread(self.write, snapshot)
