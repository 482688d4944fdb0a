"""The data the console's tests put in their cluster, so pages can be checked against it."""

from __future__ import annotations

from dataclasses import dataclass

from gms.client import SendResult

TOPIC = "orders"
SENT_PER_QUEUE = (10, 8, 6, 4)  # distinct counts, so a queue's numbers cannot pass for another's
GROUP = "billing"
COMMITTED = {0: 5, 1: 8, 2: 1}  # queue 3 left uncommitted: all of it is lag
ASSIGN_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ClusterData:
    """What the tests put in the cluster, so pages can be checked against it."""

    nameserver: str
    broker: str
    sent: list[SendResult]
    member: str  # the live consumer of GROUP

    def lag(self, queue_id: int) -> int:
        return SENT_PER_QUEUE[queue_id] - COMMITTED.get(queue_id, 0)

    @property
    def total_lag(self) -> int:
        return sum(self.lag(q) for q in range(len(SENT_PER_QUEUE)))
