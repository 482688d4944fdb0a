"""Durable replication state of a broker's queues: leader-epoch histories and high watermarks.

One JSON file (``<store>/config/replication.json``) replaced atomically, by a writer thread that
keeps what the file holds: the broker hands over only the queues that changed. Epoch histories
change only on leader changes and truncations and are written at once; high watermarks move
with every acknowledged batch and are checkpointed periodically (Kafka's
replication-offset-checkpoint): a restarted replica starts from a watermark that may be a
little low, never too high, and learns the current one from its leader.

One writer: a single thread writes the snapshots in the order they were handed over, so an
older snapshot never replaces a newer one (a checkpoint taken before a leader change but written
after it would drop the new epoch-history entry).
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from gms.broker.atomic_file import parsing, write_atomically
from gms.broker.ha.epochs import EpochHistory
from gms.private_files import make_private_dir

STATE_VERSION = 1
QueueKey = tuple[str, int]


class ReplicationStateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gms-replication-state")
        # What the file holds (the writer thread's own copy): epoch history and HW per queue.
        self._epochs: dict[QueueKey, list[list[int]]] = {}
        self._hws: dict[QueueKey, int] = {}

    def load(self) -> tuple[dict[QueueKey, EpochHistory], dict[QueueKey, int]]:
        """(epoch histories, high watermarks) per queue; empty when no file exists yet."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}, {}
        epochs: dict[QueueKey, EpochHistory] = {}
        hws: dict[QueueKey, int] = {}
        with parsing(self.path, "the replication state"):
            data = json.loads(raw)
            if data.get("v") != STATE_VERSION:
                raise ValueError(f"unsupported replication state version {data.get('v')!r}")
            for topic, queues in data["queues"].items():
                for queue_id, state in queues.items():
                    key = (topic, int(queue_id))
                    epochs[key] = EpochHistory(state["epochs"])
                    hws[key] = int(state["hw"])
        self._epochs = {key: history.to_list() for key, history in epochs.items()}
        self._hws = dict(hws)
        return epochs, hws

    def save(self, epochs: dict[QueueKey, list[list[int]]], hws: dict[QueueKey, int],
             removed: set[QueueKey] | None = None) -> Future[None]:
        """Queue a write of these changes (the caller hands them over: it must not change them):
        the epoch histories and HWs of the queues named, the ``removed`` queues gone, the others
        as written before. The future resolves once it is on disk, after every change handed
        over before it."""
        return self._writer.submit(self._write, epochs, hws, removed or set())

    def close(self) -> None:
        """Write what was handed over, then stop the writer."""
        self._writer.shutdown(wait=True)

    def _write(self, epochs: dict[QueueKey, list[list[int]]], hws: dict[QueueKey, int],
               removed: set[QueueKey]) -> None:
        self._epochs.update(epochs)
        self._hws.update(hws)
        for key in removed:
            self._epochs.pop(key, None)
            self._hws.pop(key, None)
        queues: dict[str, dict[str, dict[str, object]]] = {}
        for key in self._epochs.keys() | self._hws.keys():
            queues.setdefault(key[0], {})[str(key[1])] = {
                "epochs": self._epochs.get(key, []), "hw": self._hws.get(key, 0),
            }
        data = json.dumps({"v": STATE_VERSION, "queues": queues}, separators=(",", ":")).encode()
        make_private_dir(self.path.parent)
        write_atomically(self.path, data)
