"""The replication state file has one writer: a high-watermark checkpoint taken before a leader
epoch change but written after it must not drop the new epoch-history entry."""

from __future__ import annotations

import asyncio
import threading
import time

from gms.broker.ha.epochs import EpochHistory
from gms.broker.ha.replica_manager import ReplicaManager, ReplicationConfig
from gms.broker.ha.state_file import ReplicationStateFile
from gms.broker.registration import QueueAssignment, TopicAssignment
from gms.cluster.model import TopicSettings

SLOW_WRITE_S = 0.3


class OneQueueStore:
    """The one store call a leader of a queue that takes no writes makes."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        return 5


def leading(epoch: int) -> dict[str, TopicAssignment]:
    queue = QueueAssignment(0, "b0", "127.0.0.1:1", epoch, ("b0",), ("b0",))
    return {"t": TopicAssignment(1, (0,), (), TopicSettings(), (queue,), 1)}


def test_a_checkpoint_in_flight_never_overwrites_a_newer_epoch_history(tmp_path, monkeypatch):
    to_list = EpochHistory.to_list

    def slow_off_the_loop(self: EpochHistory) -> list[list[int]]:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(SLOW_WRITE_S)  # a slow disk, or a busy machine, under the checkpoint
        return to_list(self)

    state = ReplicationStateFile(tmp_path / "replication.json")

    async def main() -> None:
        manager = ReplicaManager(
            OneQueueStore(), None, "b0", ReplicationConfig(hw_checkpoint_interval_ms=20), state,  # type: ignore[arg-type]
            update_isr=lambda *a, **k: True, lease_alive=lambda: True, notify_readers=lambda keys: None,
            may_join_isr=lambda broker_id: True)
        manager.start()
        try:
            manager.apply(leading(0))  # epoch 0 starts at 5; the HW moves to 5: a checkpoint is due
            monkeypatch.setattr(EpochHistory, "to_list", slow_off_the_loop)
            await asyncio.sleep(0.1)  # the checkpoint thread has its snapshot and is writing it
            manager.apply(leading(1))  # epoch 1 replaces epoch 0 (no record written in 0)
            await asyncio.sleep(3 * SLOW_WRITE_S)
            assert state.load()[0][("t", 0)].to_list() == [[1, 5]]
        finally:
            await manager.stop()

    asyncio.run(main())
    assert state.load()[0][("t", 0)].to_list() == [[1, 5]]


def test_a_save_whose_waiter_gave_up_is_written_and_later_saves_still_resolve(tmp_path):
    """A save's future cancelled before its write (the task awaiting it cancelled by a broker's
    stop) must neither end the writer thread nor lose its changes: the writer once raised
    InvalidStateError setting it, and every later save then waited forever (a CI run's broker
    took more than 15 s to stop)."""
    state = ReplicationStateFile(tmp_path / "replication.json")
    state.load()
    gate = threading.Event()
    real_write = state._write

    def gated_write() -> None:
        gate.wait(10)
        real_write()

    state._write = gated_write  # type: ignore[method-assign]  # holds the first write until cancelled
    first = state.save({}, {("t", 0): 5})
    time.sleep(0.1)  # the writer took ``first`` and waits at the gate
    given_up = state.save({}, {("t", 1): 7})
    assert given_up.cancel()
    gate.set()
    first.result(10)
    later = state.save({}, {("t", 2): 9})
    later.result(10)
    state.close()
    _, hws = ReplicationStateFile(tmp_path / "replication.json").load()
    assert hws == {("t", 0): 5, ("t", 1): 7, ("t", 2): 9}
