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
- A broker that restarted after an unclean stop and has not caught up yet (``catching_up``: it may
  have lost records it acknowledged but had not flushed) counts as alive but out of sync: it
  leaves every ISR, and leads only when no other in-sync replica is alive -- a live leader among
  them hands over to a caught-up ISR member (Kafka's KIP-966).
- Every leader change (to None as well) bumps ``leader_epoch`` and stamps the controller epoch;
  an ISR change alone keeps the leader epoch (the leader is not fenced) and stamps it too.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace

from gms.cluster.model import QueueState, TopicMetadata


def next_queue_state(
    queue: QueueState,
    live: AbstractSet[str],
    *,
    unclean: bool,
    controller_epoch: int,
    catching_up: AbstractSet[str] = frozenset(),
) -> QueueState:
    """The state ``queue`` should have given the ``live`` broker ids and those of them still
    ``catching_up`` after an unclean restart (``queue`` itself if none of the rules apply)."""
    in_sync = [r for r in queue.replicas if r in queue.isr and r in live]
    caught_up = [r for r in in_sync if r not in catching_up]
    if queue.leader is not None and queue.leader in live and (queue.leader not in catching_up or not caught_up):
        isr = tuple(r for r in queue.isr if r in live and (r not in catching_up or r == queue.leader))
        return queue if isr == queue.isr else replace(queue, isr=isr, controller_epoch=controller_epoch)
    if caught_up or in_sync:
        leader: str | None = (caught_up or in_sync)[0]
        isr = tuple(caught_up) if caught_up else (in_sync[0],)
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


def reassign_leaders(
    topic: TopicMetadata,
    live: AbstractSet[str],
    *,
    controller_epoch: int,
    catching_up: AbstractSet[str] = frozenset(),
) -> TopicMetadata:
    """``topic`` with every queue brought to :func:`next_queue_state` (``topic`` itself if
    nothing changes, so callers can compare by identity or equality)."""
    unclean = topic.settings.unclean_leader_election
    queues = tuple(
        next_queue_state(q, live, unclean=unclean, controller_epoch=controller_epoch, catching_up=catching_up)
        for q in topic.queues
    )
    if all(new is old for new, old in zip(queues, topic.queues, strict=True)):
        return topic
    return replace(topic, queues=queues)
