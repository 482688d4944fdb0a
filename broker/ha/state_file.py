"""Durable replication state of a broker's queues: leader-epoch histories and high watermarks.

One JSON file (``<store>/config/replication.json``) replaced atomically, by a writer thread that
keeps what the file holds: the broker hands over only the queues that changed. Epoch histories
change only on leader changes and truncations and are written at once; high watermarks move
with every acknowledged batch and are checkpointed periodically (Kafka's
replication-offset-checkpoint): a restarted replica starts from a watermark that may be a
little low, never too high, and learns the current one from its leader.

One writer: a single thread applies the changes in the order they were handed over, so an older
one never replaces a newer one (a checkpoint taken before a leader change but written after it
would drop the new epoch-history entry), and writes the file once for all the changes that
queued up meanwhile.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from pathlib import Path

from gms.broker.atomic_file import parsing, write_atomically
from gms.broker.ha.epochs import EpochHistory
from gms.private_files import make_private_dir

STATE_VERSION = 1
QueueKey = tuple[str, int]
_Change = tuple[dict[QueueKey, list[list[int]]], dict[QueueKey, int], set[QueueKey]]  # epochs, HWs, removed


class ReplicationStateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        # What the file holds (the writer thread's own copy): epoch history and HW per queue.
        self._epochs: dict[QueueKey, list[list[int]]] = {}
        self._hws: dict[QueueKey, int] = {}
        self._lock = threading.Condition()
        self._queued: list[tuple[_Change, Future[None]]] = []  # handed over, not written yet
        self._closing = False
        self._writer: threading.Thread | None = None

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
        as written before. The future resolves once they are on disk, after every change handed
        over before them; changes handed over while the file is being written share the next
        write."""
        future: Future[None] = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the replication state file is closed")
            self._queued.append(((epochs, hws, removed or set()), future))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_queued, name="gms-replication-state",
                                                daemon=True)
                self._writer.start()
            self._lock.notify()
        return future

    def close(self) -> None:
        """Write what was handed over, then stop the writer."""
        with self._lock:
            self._closing = True
            self._lock.notify()
            writer = self._writer
        if writer is not None:
            writer.join()

    def _write_queued(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closing:
                    self._lock.wait()
                batch, self._queued = self._queued, []
            if not batch:
                return
            for (epochs, hws, removed), _ in batch:
                self._epochs.update(epochs)
                self._hws.update(hws)
                for key in removed:
                    self._epochs.pop(key, None)
                    self._hws.pop(key, None)
            try:
                self._write()
            except OSError as err:  # kept: the next write carries these changes too
                for _, future in batch:
                    future.set_exception(err)
            else:
                for _, future in batch:
                    future.set_result(None)

    def _write(self) -> None:
        queues: dict[str, dict[str, dict[str, object]]] = {}
        for key in self._epochs.keys() | self._hws.keys():
            queues.setdefault(key[0], {})[str(key[1])] = {
                "epochs": self._epochs.get(key, []), "hw": self._hws.get(key, 0),
            }
        data = json.dumps({"v": STATE_VERSION, "queues": queues}, separators=(",", ":")).encode()
        make_private_dir(self.path.parent)
        write_atomically(self.path, data)
