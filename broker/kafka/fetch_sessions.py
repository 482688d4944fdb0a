"""Fetch sessions (KIP-227, Fetch 7+): a consumer's incremental fetches name only the partitions
whose fetch position changed, and are answered only the partitions with news.

A fetch with session epoch 0 is a full one that opens a session: the broker keeps its partitions
(with each one's request row: fetch offset, max bytes) under a new session id it answers. The
client's next fetches carry that id and the epochs 1, 2, …: the partitions they name are added
or updated, those under ``forgotten_topics_data`` dropped, and the session's partitions are all
fetched, as a full fetch would; the answer holds those with records or an error, or whose high
watermark, last stable offset or log start offset changed since the session last answered them.
Epoch -1 is a full fetch without a session (closing the one named). An incremental fetch naming
a session this broker does not keep answers FETCH_SESSION_ID_NOT_FOUND, one with an epoch
other than the session's next INVALID_FETCH_SESSION_EPOCH: the client opens a new session.

Sessions live in the broker's memory, at most :data:`SESSIONS_MAX` (Kafka's
max.incremental.fetch.session.cache.slots); opening one beyond evicts the least recently used, whose
client gets FETCH_SESSION_ID_NOT_FOUND on its next fetch and starts over. Each fetch is served by
the ordinary fetch handler, so its checks (leadership, ACLs) apply to every fetch of a session.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gms.broker.kafka.errors import Err

SESSIONS_MAX = 1_000
SESSIONS_VERSION = 7  # the first Fetch version with sessions
INITIAL_EPOCH, FINAL_EPOCH = 0, -1
EPOCH_MAX = (1 << 31) - 1

Fetch = Callable[[dict[str, Any], int, str], Awaitable[dict[str, Any]]]
Marks = tuple[int, int, int]  # a partition's high watermark, last stable offset, log start offset as answered


@dataclass(slots=True)
class _Session:
    epoch: int = 1  # the epoch the next fetch must carry
    # (topic, partition) -> its request row, and what the session last answered of it
    partitions: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    answered: dict[tuple[str, int], Marks] = field(default_factory=dict)

    def update(self, req: dict[str, Any]) -> None:
        """Add or update the partitions a fetch names; drop the forgotten ones."""
        for topic in req["topics"]:
            for partition in topic["partitions"]:
                self.partitions[topic["topic"], partition["partition"]] = partition
        for topic in req.get("forgotten_topics_data") or ():
            for partition_id in topic["partitions"]:
                self.partitions.pop((topic["topic"], partition_id), None)
                self.answered.pop((topic["topic"], partition_id), None)

    def topics(self) -> list[dict[str, Any]]:
        """The session's partitions as a full fetch's topics."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, _), partition in self.partitions.items():
            by_topic.setdefault(topic, []).append(partition)
        return [{"topic": topic, "partitions": rows} for topic, rows in by_topic.items()]

    def news(self, responses: list[dict[str, Any]], incremental: bool) -> list[dict[str, Any]]:
        """The answer's topics, remembering each partition's marks; of an incremental fetch, only
        the partitions with records, an error or marks changed."""
        kept = []
        for topic in responses:
            rows = []
            for row in topic["partitions"]:
                key = (topic["topic"], row["partition_index"])
                marks = (row["high_watermark"], row["last_stable_offset"], row["log_start_offset"])
                changed = row["error_code"] != 0 or len(row["records"] or b"") > 0 or self.answered.get(key) != marks
                if key in self.partitions:
                    self.answered[key] = marks
                if changed or not incremental:
                    rows.append(row)
            if rows:
                kept.append({**topic, "partitions": rows})
        return kept


class FetchSessions:
    """The fetch sessions of one Kafka endpoint, in front of its fetch handler."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._sessions: OrderedDict[int, _Session] = OrderedDict()  # least recently used first

    async def fetch(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        if version < SESSIONS_VERSION:
            return await self._fetch(req, version, client)
        session_id, epoch = req["session_id"], req["session_epoch"]
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self._sessions.pop(session_id, None)
            answer = await self._fetch(req, version, client)
            if epoch == INITIAL_EPOCH:
                answer["session_id"] = self._open(req, answer)
            return answer
        session = self._sessions.get(session_id)
        if session is None:
            return _refused(Err.FETCH_SESSION_ID_NOT_FOUND)
        if epoch != session.epoch:
            return _refused(Err.INVALID_FETCH_SESSION_EPOCH)
        session.epoch = epoch + 1 if epoch < EPOCH_MAX else 1
        self._sessions.move_to_end(session_id)
        session.update(req)
        answer = await self._fetch({**req, "topics": session.topics()}, version, client)
        answer["responses"] = session.news(answer["responses"], incremental=True)
        answer["session_id"] = session_id if answer["error_code"] == 0 else 0
        return answer

    def _open(self, req: dict[str, Any], answer: dict[str, Any]) -> int:
        """A new session of the full fetch ``req`` answered ``answer``: its id (0: none, the
        fetch failed as a whole)."""
        if answer["error_code"] != 0:
            return 0
        while len(self._sessions) >= SESSIONS_MAX:
            self._sessions.popitem(last=False)
        session_id = 0
        while session_id == 0 or session_id in self._sessions:
            session_id = secrets.randbelow(EPOCH_MAX) + 1
        session = self._sessions[session_id] = _Session()
        session.update(req)
        session.news(answer["responses"], incremental=False)
        return session_id


def _refused(code: int) -> dict[str, Any]:
    return {"error_code": code, "session_id": 0, "responses": []}
