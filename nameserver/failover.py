"""The controller's leader-election rules for a queue, as pure functions of (stored state, live
brokers): no etcd and no threads, so every rule is unit-testable. See docs/replication.md.

- The leader is alive: only dead brokers leave the ISR (a broker whose lease expired, paused or
  gone, must not hold up acks=-1 sends for the leader's whole lag window); the leader itself
  maintains its ISR otherwise, and takes a returning broker back once it caught up.
- Otherwise the new leader is the first replica, in ``replicas`` order, that is in the ISR and
  alive; the ISR becomes its live members (dead ones drop out, the new leader stays).
- No ISR member alive: with ``unclean_leader_election`` the first live replica leads with an
  ISR of itself (acknowledged messages may be lost); without, the queue goes offline
  (leader None) and keeps its ISR, so whichever of those brokers returns first is elected.
- Every leader change (to None as well) bumps ``leader_epoch`` and stamps the controller epoch;
  an ISR change alone keeps the leader epoch (the leader is not fenced) and stamps it too.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace

from gms.cluster.model import QueueState, TopicMetadata


def next_queue_state(
    queue: QueueState, live: AbstractSet[str], *, unclean: bool, controller_epoch: int
) -> QueueState:
    """The state ``queue`` should have given the ``live`` broker ids (``queue`` itself if none
    of the rules apply)."""
    if queue.leader is not None and queue.leader in live:
        isr = tuple(r for r in queue.isr if r in live)
        return queue if isr == queue.isr else replace(queue, isr=isr, controller_epoch=controller_epoch)
    in_sync = [r for r in queue.replicas if r in queue.isr and r in live]
    if in_sync:
        leader: str | None = in_sync[0]
        isr = tuple(in_sync)
    elif unclean and any(r in live for r in queue.replicas):
        leader = next(r for r in queue.replicas if r in live)
        isr = (leader,)
    elif queue.leader is None:
        return queue  # offline and still no eligible replica
    else:
        leader, isr = None, queue.isr
    return replace(
        queue,
        leader=leader,
        isr=isr,
        leader_epoch=queue.leader_epoch + 1,
        controller_epoch=controller_epoch,
    )


def reassign_leaders(topic: TopicMetadata, live: AbstractSet[str], *, controller_epoch: int) -> TopicMetadata:
    """``topic`` with every queue brought to :func:`next_queue_state` (``topic`` itself if
    nothing changes, so callers can compare by identity or equality)."""
    unclean = topic.settings.unclean_leader_election
    queues = tuple(
        next_queue_state(q, live, unclean=unclean, controller_epoch=controller_epoch)
        for q in topic.queues
    )
    if all(new is old for new, old in zip(queues, topic.queues, strict=True)):
        return topic
    return replace(topic, queues=queues)
