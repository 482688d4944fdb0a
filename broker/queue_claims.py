"""Which member of a group reads each queue this broker leads: the data path's fence.

The group coordinator may sit on another broker, and a coordinator that just took a group over
(restart, failover) can hand a queue to a new member before the member still reading it has
told it so. The queue's leader closes that gap: a clustering member's pull *claims* the queue
for the member; while the claim is fresh, pulls, start-offset lookups and commits of another
member of the same group are refused with the retriable :class:`QueueHeldError`. A claim ends
when its member releases it (the commit that hands the queue over), or lapses one member expiry
after the member's last pull (a parked long poll counts as reading until it is answered).

Time is passed in (``now_ms``) so the rules can be tested without sleeping.
"""

from __future__ import annotations

from collections.abc import Iterable

from gms.errors import QueueHeldError

ClaimKey = tuple[str, str, int]  # (group, topic, queue id)


class QueueClaims:
    def __init__(self, hold_ms: int) -> None:
        self.hold_ms = hold_ms
        self._claims: dict[ClaimKey, tuple[str, int]] = {}  # -> (member, fresh until ms)

    def check(self, group: str, member: str, topic: str, queue_id: int, now_ms: int) -> None:
        """Raise QueueHeldError if another member of ``group`` holds a fresh claim."""
        claim = self._claims.get((group, topic, queue_id))
        if claim is not None and claim[0] != member and claim[1] >= now_ms:
            raise QueueHeldError(
                f"queue {topic}/{queue_id} of group {group!r} is still read by member {claim[0]!r}; "
                "retry once it has released the queue", fields={"holder": claim[0]})

    def claim(self, group: str, member: str, topic: str, queue_id: int, now_ms: int, busy_ms: int = 0) -> None:
        """Check, then claim the queue for ``member`` until ``busy_ms`` (a long poll's wait) plus
        the hold time from now."""
        self.check(group, member, topic, queue_id, now_ms)
        self._claims[(group, topic, queue_id)] = (member, now_ms + busy_ms + self.hold_ms)

    def refresh(self, group: str, member: str, topic: str, queue_id: int, now_ms: int) -> None:
        """Restart the hold time of ``member``'s claim (a pull answered); no claim, no change:
        a long poll answered after its member released the queue must not claim it again."""
        self.refresh_many(group, member, [(topic, queue_id)], now_ms)

    def refresh_many(self, group: str, member: str, queues: Iterable[tuple[str, int]], now_ms: int) -> None:
        """:meth:`refresh` of each of ``queues`` (a FETCH answered); a claim that lasts past the
        new hold time already (its long poll's wait was counted in) is left as it is."""
        claims, until = self._claims, now_ms + self.hold_ms
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            claim = claims.get(key)
            if claim is not None and claim[0] == member and claim[1] < until:
                claims[key] = (member, until)

    def release(self, group: str, member: str, queues: Iterable[tuple[str, int]]) -> None:
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            claim = self._claims.get(key)
            if claim is not None and claim[0] == member:
                del self._claims[key]

    def readers(self, group: str, now_ms: int, queues: Iterable[tuple[str, int]] | None = None) -> set[str]:
        """The members of ``group`` with a fresh claim here (on ``queues``, or on any queue)."""
        wanted = None if queues is None else set(queues)
        return {member for (g, topic, queue_id), (member, until_ms) in self._claims.items()
                if g == group and until_ms >= now_ms and (wanted is None or (topic, queue_id) in wanted)}

    def prune(self, now_ms: int) -> None:
        """Forget lapsed claims."""
        for key, (_, until_ms) in list(self._claims.items()):
            if until_ms < now_ms:
                del self._claims[key]
