"""The rows of replication's requests and answers (REPLICA_FETCH, OFFSET_FOR_LEADER_EPOCH): one
schema each, shared by the leader's handlers (broker/ha/leader_handlers.py) and the follower's
fetcher (broker/ha/fetcher.py). How the two use them: docs/replication.md and those modules.

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

Row statuses are 0 or a wire Status: NOT_LEADER, FENCED_LEADER_EPOCH (the two epochs differ:
whoever is behind must learn the new metadata first), OFFSET_ILLEGAL (fetch offset beyond the
leader's end: truncate first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gms.protocol.rows import ARRAY, BIN, I32, I64, STR, WireRow, column, list_of, rows_of

SIZES_DTYPE = np.dtype(">i4")  # record sizes in a FetchedRange, as bytes


@dataclass(frozen=True, slots=True)
class FetchWant(WireRow):
    """One queue the follower copies from this leader."""

    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    fetch_offset: int = column(I64, "the follower's log end offset: it has every offset below it")
    leader_epoch: int = column(I64, "the epoch the follower believes the leader has")
    last_epoch: int = column(I64, "the newest epoch in the follower's own history (the leader sends the"
                                  " newer entries of its history that the records cover)")
    offsets_seq: int = column(I64, "the last consumer-group commit of the queue the follower copied"
                                   " (counts only in the request's `offsets_session`)", default=0)


@dataclass(frozen=True, slots=True)
class RepairWant(WireRow):
    """Records the follower holds damaged (a bit flipped on its disk, found by its recovery or a
    read) and asks again."""

    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    leader_epoch: int = column(I64, "as in `FetchWant`")
    offsets: list[int] = column(list_of(I64), "the queue offsets of the damaged records, below the fetch offset")


@dataclass(frozen=True, slots=True)
class EpochEntry(WireRow):
    """An entry of the leader's epoch history."""

    epoch: int = column(I64, "a leader epoch")
    start_offset: int = column(I64, "the queue offset of its first record")


@dataclass(frozen=True, slots=True)
class GroupCommit(WireRow):
    """A consumer group's committed offset on a queue (broker/offsets.py)."""

    group: str = column(STR, "the consumer group")
    offset: int = column(I64, "its committed offset; −1: the group's offset on the queue was deleted")
    pop: list[Any] | None = column(ARRAY, "the group's pop state on the queue (broker/pop.py, `PopQueue.wire`),"
                                          " when it has one", default=None, trailing=True)


@dataclass(frozen=True, slots=True)
class OffsetRun(WireRow):
    """A run of consecutive queue offsets."""

    first: int = column(I64, "its first offset")
    count: int = column(I64, "how many")


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
    return np.concatenate([np.arange(r.first, r.first + r.count, dtype=np.int64) for r in runs])


@dataclass(frozen=True, slots=True)
class FetchedRange(WireRow):
    """What the leader sends of one asked queue. The answered range
    is the records (``size`` bytes of the body) and the ``damaged`` offsets together, from the
    fetch offset on. A refused row (status not 0) ends at ``sizes``."""

    OPEN = True

    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    status: int = column(I32, "0, or the wire status refusing the fetch of this queue")
    hw: int = column(I64, "the leader's high watermark")
    leo: int = column(I64, "the leader's log end offset")
    size: int = column(I64, "bytes of this queue's records in the body")
    epochs: tuple[EpochEntry, ...] = column(rows_of(EpochEntry), "the entries of the leader's epoch history newer"
                                            " than the follower's `last_epoch` that the records cover")
    commits: tuple[GroupCommit, ...] = column(
        rows_of(GroupCommit), "the groups that committed on the queue after the follower's `offsets_seq` (all of"
        " them when that is 0 or of another session: the follower drops the groups left out); the follower"
        " stores them and sends this answer's `offsets_session` and `offsets_seq` next")
    crc: int = column(I64, "zlib's CRC-32 of the queue's records in the body: the follower checks this one CRC"
                           " instead of every record's (the leader checked those when it accepted them)")
    sizes: bytes = column(BIN, "the records' sizes, big-endian int32 each, from the leader's consumeQueue: the"
                               " follower finds record starts with one cumsum and checks them against each"
                               " record's own size (empty: none sent)", default=b"")
    log_start: int | None = column(
        I64, "the leader's minimum offset of the queue (retention moves it): a follower whose fetch offset is"
        " below it missed records that expired on the leader and starts its queue over there (Kafka's log"
        " start offset)", default=None, trailing=True)
    damaged: tuple[OffsetRun, ...] = column(
        rows_of(OffsetRun), "the offsets of the answered range the leader holds damaged (a record whose CRC"
        " fails, or a lost entry), in offset order, one run per damaged stretch: not in the body (nor in"
        " `size`, `crc`, `sizes`); the follower indexes them as damaged and never stores the damaged bytes",
        default=(), trailing=True)

    def record_sizes(self) -> np.ndarray | None:
        return np.frombuffer(self.sizes, SIZES_DTYPE) if self.sizes else None

    def damaged_offsets(self) -> np.ndarray:
        return run_offsets(self.damaged)


@dataclass(frozen=True, slots=True)
class RepairedRecord(WireRow):
    """One asked record in a :class:`RepairedQueue`."""

    offset: int = column(I64, "the queue offset asked")
    size: int = column(I64, "bytes of the leader's record in the body; 0: the leader has no intact copy"
                            " (damaged too, or outside its queue)")
    crc: int = column(I64, "zlib's CRC-32 of the record's bytes")


@dataclass(frozen=True, slots=True)
class RepairedQueue(WireRow):
    """The leader's intact copies of one ``repair`` row's records. The follower checks them
    (``crc``, its own record's size, the record's CRC) and rewrites its damaged copy in place
    (``MessageStore.repair_record``)."""

    OPEN = True

    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    status: int = column(I32, "as in `FetchedRange`")
    records: tuple[RepairedRecord, ...] = column(rows_of(RepairedRecord), "one per offset asked, in order (the"
                                                 " leader may leave out the last ones: its byte budget)")


@dataclass(frozen=True, slots=True)
class EpochQuery(WireRow):
    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    leader_epoch: int = column(I64, "the epoch the follower believes the leader has")
    epoch: int = column(I64, "the follower's newest epoch")


@dataclass(frozen=True, slots=True)
class EpochAnswer(WireRow):
    """The largest epoch ≤ the one asked that the leader knows, and the offset where it ends on
    the leader."""

    OPEN = True

    topic: str = column(STR, "the queue's topic")
    queue_id: int = column(I32, "the queue")
    status: int = column(I32, "0, or the wire status refusing the query")
    epoch: int = column(I64, "the epoch (−1 when refused or unknown)")
    end_offset: int = column(I64, "where it ends on the leader")
