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
from typing import Any

from gms.broker.atomic_file import parsing, write_atomically
from gms.broker.ha.epochs import EpochHistory
from gms.private_files import make_private_dir

STATE_VERSION = 1
QueueKey = tuple[str, int]
_Change = tuple[dict[QueueKey, list[list[int]]], dict[QueueKey, int], set[QueueKey]]  # epochs, HWs, removed


class ReplicationStateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        # What the file holds (the writer thread's own copy): per topic, per queue id (a string),
        # {"epochs": [[epoch, start offset], ...], "hw": high watermark}.
        self._queues: dict[str, dict[str, dict[str, Any]]] = {}
        self._fragments: dict[str, str] = {}  # per topic, its part of the file as last written
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
        self._queues = {topic: {str(int(queue_id)): {"epochs": state["epochs"], "hw": int(state["hw"])}
                                for queue_id, state in queues.items()}
                        for topic, queues in data["queues"].items()}
        self._fragments = {}
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
                self._merge(epochs, hws, removed)
            # A waiter cancelled (a task cancelled by a stop) gave its future up, not its changes:
            # those are written, and only the futures still wanted are resolved (setting a
            # cancelled one raised here and ended this thread, and every later save waited forever).
            wanted = [future for _, future in batch if future.set_running_or_notify_cancel()]
            try:
                self._write()
            except OSError as err:  # kept: the next write carries these changes too
                for future in wanted:
                    future.set_exception(err)
            else:
                for future in wanted:
                    future.set_result(None)

    def _merge(self, epochs: dict[QueueKey, list[list[int]]], hws: dict[QueueKey, int],
               removed: set[QueueKey]) -> None:
        for (topic, queue_id), history in epochs.items():
            state = self._queue_state(topic, queue_id)
            if state["epochs"] != history:
                state["epochs"] = history
                self._fragments.pop(topic, None)
        for (topic, queue_id), hw in hws.items():
            state = self._queue_state(topic, queue_id)
            if state["hw"] != hw:
                state["hw"] = hw
                self._fragments.pop(topic, None)
        for topic, queue_id in removed:
            queues = self._queues.get(topic)
            if queues is not None and queues.pop(str(queue_id), None) is not None:
                self._fragments.pop(topic, None)
                if not queues:
                    del self._queues[topic]

    def _queue_state(self, topic: str, queue_id: int) -> dict[str, Any]:
        queues = self._queues.setdefault(topic, {})
        state = queues.get(str(queue_id))
        if state is None:
            state = queues[str(queue_id)] = {"epochs": [], "hw": 0}
            self._fragments.pop(topic, None)
        return state

    def _write(self) -> None:
        """The file, each topic's part encoded again only if it changed since the last write (the
        HWs of a few busy queues change every checkpoint; encoding every queue's would hold the
        GIL from the event loop for milliseconds per thousand queues)."""
        for topic, queues in self._queues.items():
            if topic not in self._fragments:
                self._fragments[topic] = f"{json.dumps(topic)}:{json.dumps(queues, separators=(',', ':'))}"
        parts = [self._fragments[topic] for topic in self._queues]
        data = f'{{"v":{STATE_VERSION},"queues":{{{",".join(parts)}}}}}'.encode()
        make_private_dir(self.path.parent)
        write_atomically(self.path, data)
