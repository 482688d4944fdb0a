"""A broker back from an unclean stop publishes "caught up" (electable again, KIP-966) only when
nothing is left for the controller to hand over: a queue it still leads from before the stop,
with another registered, caught-up ISR member, must first move to that member. Publishing at
once (it follows no queue, so it "caught up with every leader") raced the controller, which then
kept a leader that may have lost acknowledged records (a CI failure of test_ha_hw_restart)."""

from __future__ import annotations

import asyncio

from gms.broker.ha.replica_manager import ReplicaManager, ReplicationConfig
from gms.broker.ha.state_file import ReplicationStateFile
from gms.broker.registration import QueueAssignment, TopicAssignment
from gms.cluster.model import TopicSettings


class OneQueueStore:
    """The one store call a leader of a queue that takes no writes makes."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        return 5


def assignment(leader: str, isr: tuple[str, ...]) -> dict[str, TopicAssignment]:
    queue = QueueAssignment(0, leader, "127.0.0.1:1", 0, isr, ("b0", "b1"))
    return {"t": TopicAssignment(1, (0,) if leader == "b0" else (), (), TopicSettings(), (queue,), 1)}


def published_after(tmp_path, assignments: dict[str, TopicAssignment], caught_up_peers: set[str]) -> bool:
    published: list[bool] = []

    async def main() -> None:
        manager = ReplicaManager(
            OneQueueStore(), None, "b0", ReplicationConfig(), ReplicationStateFile(tmp_path / "r.json"),  # type: ignore[arg-type]
            update_isr=lambda *a, **k: True, lease_alive=lambda: True, notify_readers=lambda keys: None,
            may_join_isr=lambda broker_id: broker_id in caught_up_peers,
            on_caught_up=lambda: published.append(True))
        manager.start()
        try:
            manager.apply(assignments)
            await asyncio.sleep(0.2)  # the publication runs in a thread
        finally:
            await manager.stop()

    asyncio.run(main())
    return bool(published)


def test_a_queue_still_led_with_a_caught_up_isr_member_holds_the_publication_back(tmp_path):
    assert not published_after(tmp_path, assignment("b0", ("b0", "b1")), caught_up_peers={"b1"})


def test_a_queue_led_with_no_one_to_hand_over_to_lets_it_publish(tmp_path):
    # The other ISR member is dead or catching up itself: the controller keeps this leader.
    assert published_after(tmp_path, assignment("b0", ("b0", "b1")), caught_up_peers=set())
    assert published_after(tmp_path, assignment("b0", ("b0",)), caught_up_peers={"b1"})
