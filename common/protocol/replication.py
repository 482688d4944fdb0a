"""The rows of replication's requests and answers (REPLICA_FETCH, OFFSET_FOR_LEADER_EPOCH): one
schema each, shared by the leader's side (broker/services/replication.py, on the wire
broker/ha/leader_handlers.py) and the follower's fetcher (broker/ha/fetcher.py). How the two use
them: docs/replication.md and those modules.

REPLICA_FETCH (200), one request for every queue a follower follows from one leader:
  request fields: ``replica`` (the follower's broker id), ``wait_ms`` (long-poll bound when nothing
  is new), ``bytes_max`` (response body bound), ``offsets_session`` (the leader's offset-store
  session the ``offsets_seq`` of the rows refer to; 0 or absent: none), ``queues``
  (:class:`FetchWant` rows), ``repair`` (optional, :class:`RepairWant` rows: records the follower
  holds damaged, below its fetch offset).
  answer fields: ``offsets_session``, ``offsets_seq``, ``queues`` (a :class:`FetchedRange` per
  asked row, in order), ``repaired`` (a :class:`RepairedQueue` per ``repair`` row). The body holds
  every queue's records back to back in the order of ``queues``, as stored, then the repaired
  records in the order of ``repaired``.
OFFSET_FOR_LEADER_EPOCH (202), the follower's truncation point (Kafka KIP-101):
  request ``queues``: :class:`EpochQuery` rows; answer ``queues``: an :class:`EpochAnswer` per row.
REPLICA_COMPACTED (203), a chunk of the leader's compacted log of one queue, for a follower
  below its compaction point: plain fields, no rows (docs/protocol.md; the leader's side:
  ``ReplicationService.compacted_chunk``, the follower's: broker/ha/compacted_copy.py).

Row statuses are 0 or a wire Status: NOT_LEADER, FENCED_LEADER_EPOCH (the two epochs differ:
whoever is behind must learn the new metadata first), OFFSET_ILLEGAL (fetch offset beyond the
leader's end: truncate first).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from gms.protocol.rows import ARRAY, BIN, I32, I64, QUEUE_ID, STR, TOPIC, col, list_of, rows_of, wire_row

SIZES_DTYPE = np.dtype(">i4")  # record sizes in a FetchedRange, as bytes


class FetchWant(NamedTuple):
    """One queue the follower copies from this leader."""

    topic: str
    queue_id: int
    fetch_offset: int
    leader_epoch: int
    last_epoch: int
    offsets_seq: int = 0


wire_row(
    FetchWant,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    fetch_offset=col(I64, "the follower's log end offset: it has every offset below it"),
    leader_epoch=col(I64, "the epoch the follower believes the leader has"),
    last_epoch=col(I64, "the newest epoch in the follower's own history (the leader sends the"
        " newer entries of its history that the records cover)"),
    offsets_seq=col(I64, "the last consumer-group commit of the queue the follower copied"
        " (counts only in the request's `offsets_session`)"),
)


class RepairWant(NamedTuple):
    """Records the follower holds damaged (a bit flipped on its disk, found by its recovery or a
    read) and asks again."""

    topic: str
    queue_id: int
    leader_epoch: int
    offsets: list[int]


wire_row(
    RepairWant,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    leader_epoch=col(I64, "as in `FetchWant`"),
    offsets=col(list_of(I64), "the queue offsets of the damaged records, below the fetch offset"),
)


class EpochEntry(NamedTuple):
    """An entry of the leader's epoch history."""

    epoch: int
    start_offset: int


wire_row(
    EpochEntry,
    epoch=col(I64, "a leader epoch"),
    start_offset=col(I64, "the queue offset of its first record"),
)


class GroupCommit(NamedTuple):
    """A consumer group's committed offset on a queue (broker/offsets.py)."""

    group: str
    offset: int
    pop: list[Any] | None = None


wire_row(
    GroupCommit,
    group=col(STR, "the consumer group"),
    offset=col(I64, "its committed offset; −1: the group's offset on the queue was deleted"),
    pop=col(ARRAY, "the group's pop state on the queue (broker/pop.py, `PopQueue.wire`),"
        " when it has one", trailing=True),
)


class OffsetRun(NamedTuple):
    """A run of consecutive queue offsets."""

    first: int
    length: int


wire_row(
    OffsetRun,
    first=col(I64, "its first offset"),
    length=col(I64, "how many"),
)


def offset_runs(offsets: np.ndarray) -> tuple[OffsetRun, ...]:
    """The runs of consecutive values in ascending ``offsets``."""
    if not len(offsets):
        return ()
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    firsts = np.concatenate(([0], breaks))
    counts = np.diff(np.concatenate((firsts, [len(offsets)])))
    return tuple(OffsetRun(int(offsets[i]), int(n)) for i, n in zip(firsts.tolist(), counts.tolist(), strict=True))


def run_offsets(runs: tuple[OffsetRun, ...]) -> np.ndarray:
    """The offsets of the runs (what :func:`offset_runs` encodes)."""
    if not runs:
        return np.empty(0, np.int64)
    return np.concatenate([np.arange(r.first, r.first + r.length, dtype=np.int64) for r in runs])


class FetchedRange(NamedTuple):
    """What the leader sends of one asked queue. The answered range is the records (``size``
    bytes of the body) and the ``damaged`` offsets together, from the fetch offset on. A refused
    row (status not 0) ends at ``sizes``."""

    topic: str
    queue_id: int
    status: int
    hw: int
    leo: int
    size: int
    epochs: tuple[EpochEntry, ...]
    commits: tuple[GroupCommit, ...]
    crc: int
    sizes: bytes = b""
    log_start: int | None = None
    damaged: tuple[OffsetRun, ...] = ()

    def record_sizes(self) -> np.ndarray | None:
        return np.frombuffer(self.sizes, SIZES_DTYPE) if self.sizes else None

    def damaged_offsets(self) -> np.ndarray:
        return run_offsets(self.damaged)


wire_row(
    FetchedRange, open=True,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    status=col(I32, "0, or the wire status refusing the fetch of this queue"),
    hw=col(I64, "the leader's high watermark"),
    leo=col(I64, "the leader's log end offset"),
    size=col(I64, "bytes of this queue's records in the body"),
    epochs=col(rows_of(EpochEntry), "the entries of the leader's epoch history newer"
        " than the follower's `last_epoch` that the records cover"),
    commits=col(rows_of(GroupCommit), "the groups that committed on the queue after the follower's"
        " `offsets_seq` (all of them when that is 0 or of another session: the follower drops the groups"
        " left out); the follower stores them and sends this answer's `offsets_session` and `offsets_seq` next"),
    crc=col(I64, "zlib's CRC-32 of the queue's records in the body: the follower checks this one CRC"
        " instead of every record's (the leader checked those when it accepted them)"),
    sizes=col(BIN, "the records' sizes, big-endian int32 each, from the leader's consumeQueue: the"
        " follower finds record starts with one cumsum and checks them against each"
        " record's own size (empty: none sent)"),
    log_start=col(I64, "the leader's minimum offset of the queue (retention moves it): a follower whose fetch offset is"
        " below it missed records that expired on the leader and starts its queue over there (Kafka's log"
        " start offset)", trailing=True),
    damaged=col(rows_of(OffsetRun), "the offsets of the answered range the leader holds damaged (a record whose CRC"
        " fails, or a lost entry), in offset order, one run per damaged stretch: not in the body (nor in"
        " `size`, `crc`, `sizes`); the follower indexes them as damaged and never stores the damaged bytes",
        trailing=True),
)


class RepairedRecord(NamedTuple):
    """One asked record in a :class:`RepairedQueue`."""

    offset: int
    size: int
    crc: int


wire_row(
    RepairedRecord,
    offset=col(I64, "the queue offset asked"),
    size=col(I64, "bytes of the leader's record in the body; 0: the leader has no intact copy"
        " (damaged too, or outside its queue)"),
    crc=col(I64, "zlib's CRC-32 of the record's bytes"),
)


class RepairedQueue(NamedTuple):
    """The leader's intact copies of one ``repair`` row's records. The follower checks them
    (``crc``, its own record's size, the record's CRC) and rewrites its damaged copy in place
    (``MessageStore.repair_record``)."""

    topic: str
    queue_id: int
    status: int
    records: tuple[RepairedRecord, ...]


wire_row(
    RepairedQueue, open=True,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    status=col(I32, "as in `FetchedRange`"),
    records=col(rows_of(RepairedRecord), "one per offset asked, in order (the"
        " leader may leave out the last ones: its byte budget)"),
)


class EpochQuery(NamedTuple):
    """The point where the follower's history may diverge from the leader's."""

    topic: str
    queue_id: int
    leader_epoch: int
    epoch: int


wire_row(
    EpochQuery,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    leader_epoch=col(I64, "the epoch the follower believes the leader has"),
    epoch=col(I64, "the follower's newest epoch"),
)


class EpochAnswer(NamedTuple):
    """The largest epoch ≤ the one asked that the leader knows, and the offset where it ends on
    the leader."""

    topic: str
    queue_id: int
    status: int
    epoch: int
    end_offset: int


wire_row(
    EpochAnswer, open=True,
    topic=TOPIC,
    queue_id=QUEUE_ID,
    status=col(I32, "0, or the wire status refusing the query"),
    epoch=col(I64, "the epoch (−1 when refused or unknown)"),
    end_offset=col(I64, "where it ends on the leader"),
)
