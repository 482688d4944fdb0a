"""Leader-epoch history of one queue (Kafka KIP-101): which epoch wrote which offsets.

An entry ``(epoch, start_offset)`` says the leader of ``epoch`` wrote its first record of the
queue at ``start_offset``; the epoch covers offsets up to the next entry's start. After a
failover a replica asks the new leader where its own latest epoch ends there
(OFFSET_FOR_LEADER_EPOCH) and truncates to that point: the first offset where the two
histories can differ. Unlike truncating to the high watermark, this neither drops records the
new leader has nor keeps records it never had.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

UNDEFINED_EPOCH = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class EpochEnd(NamedTuple):
    """Answer to "where does ``epoch`` end?": the largest known epoch <= the one asked and the
    offset where it ends (UNDEFINED_EPOCH when nothing that old is known)."""

    epoch: int
    end_offset: int


class EpochHistory:
    def __init__(self, entries: Iterable[Sequence[int]] = ()) -> None:
        """``entries``: (epoch, start offset) pairs, oldest first (as :meth:`to_list` gives)."""
        # Replaced on every change, never changed in place (copies share it).
        self.entries: list[EpochEntry] = [EpochEntry(int(e), int(s)) for e, s in entries]

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the history changed.

        Entries that start at or after ``start_offset`` covered no record (an epoch that never
        wrote one): they are replaced. An older epoch is ignored."""
        if epoch <= self.latest_epoch:
            return False
        self.entries = [*(e for e in self.entries if e.start_offset < start_offset), EpochEntry(epoch, start_offset)]
        return True

    def end_for(self, epoch: int, log_end_offset: int) -> EpochEnd:
        """Where ``epoch`` ends in this history, given the queue's log end offset."""
        found = UNDEFINED_EPOCH
        for entry in self.entries:
            if entry.epoch > epoch:
                return EpochEnd(found, entry.start_offset)
            found = entry.epoch
        return EpochEnd(found, log_end_offset)

    def truncate_from(self, offset: int) -> None:
        """The queue was cut at ``offset``: forget epochs that start at or after it."""
        self.entries = [e for e in self.entries if e.start_offset < offset]

    def copy(self) -> EpochHistory:
        """A copy that later changes of this one leave alone (cheap: ``entries`` is never
        changed in place, only replaced)."""
        twin = EpochHistory()
        twin.entries = self.entries
        return twin

    def to_list(self) -> list[list[int]]:
        return [[e.epoch, e.start_offset] for e in self.entries]
