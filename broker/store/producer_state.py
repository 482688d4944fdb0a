"""What the store knows of idempotent producers: per queue, each producer's epoch and last batches.

Kafka's producer state (KIP-98), kept by the store beside its indexes. A batch stamped with a
:class:`BatchSequence` is accepted when it is the producer's next one on that queue; a retry of
one of its last :data:`BATCHES_KEPT` batches is a duplicate (answered with the stored offsets).
A Kafka producer (RECORD_NUMBERED in its epoch) numbers records instead: its next batch starts at
the number after the previous batch's records. Anything else is refused: a gap
(``OUT_OF_ORDER_SEQUENCE``, retriable: an earlier batch is on its way), a stale epoch
(``PRODUCER_FENCED``) or a batch older than those kept (:class:`SequenceTooOldError`). So a
queue stores one producer's batches in the order they were numbered, or refuses them. A producer
this store does not know on a queue may start only at batch 0: a later batch is refused
(``UNKNOWN_PRODUCER_ID``, retriable), since its earlier ones may still be on their way. When they
are not (the state expired, or was cut with the batches it described), the producer, with nothing
earlier of that queue unacknowledged, numbers the queue from 0 again under a new epoch (KIP-360; client/idempotence.py).

Every stamped record in the log updates the state, whoever wrote it (a send, replication,
recovery's re-indexing), so followers know it before they lead. A snapshot written with each
store checkpoint holds the state for the records below the checkpoint; crash recovery re-indexes
the rest. A damaged snapshot (its CRC fails) is rebuilt by re-indexing the whole log. Producers
idle for ``expiry_ms`` are forgotten. Runs under the store's write lock.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections import deque
from pathlib import Path
from typing import NamedTuple

import msgpack

from gms.broker.atomic_file import write_atomically
from gms.errors import OutOfOrderSequenceError, ProducerFencedError, SequenceTooOldError, UnknownProducerIdError
from gms.record.sequence import BatchSequence

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
SWEEPS_PER_EXPIRY = 10  # idle producers are looked for this often per expiry period
BATCHES_KEPT = 16  # a producer keeps at most 5 batches in flight per queue (client/producer.py)
# A CRC-32 line (8 hex digits) before the snapshot: msgpack since version 3 (json, version 2, is still
# read): thousands of queues are saved every second, and json took 4 times as long to encode them.
SNAPSHOT_VERSION = 3
JSON_SNAPSHOT_VERSION = 2
JSON_SNAPSHOT_NAME = "producers.json"  # beside the snapshot: read when there is no snapshot yet (an upgrade)


class StoredBatch(NamedTuple):
    sequence: int
    records: int
    base_offset: int  # the queue offset of its first record
    phys: int  # the commitlog offset of its first record


class KnownBatch(NamedTuple):
    """A batch sent again: where it was stored, and how many of its records the queue holds
    (fewer than all when a replica had fetched part of it before it came to lead)."""

    base_offset: int
    stored: int


class DuplicateBatch(Exception):
    """The batch was stored before (``stored`` of its ``count`` records, from ``base_offset``):
    the send is answered with where it is."""

    def __init__(self, key: QueueKey, base_offset: int, stored: int, count: int) -> None:
        super().__init__(f"{key[0]}/{key[1]}: batch stored before at {base_offset}")
        self.key, self.base_offset, self.stored, self.count = key, base_offset, stored, count


class _Producer:
    __slots__ = ("batches", "epoch", "last_ms")

    def __init__(self, epoch: int, last_ms: int) -> None:
        self.epoch = epoch
        self.last_ms = last_ms
        self.batches: deque[StoredBatch] = deque(maxlen=BATCHES_KEPT)


def _following(batch: StoredBatch, epoch: int) -> int:
    """The sequence of the batch after ``batch``: the next number, or for a producer numbering
    records (Kafka's, RECORD_NUMBERED in its epoch) the number after its records."""
    return BatchSequence(0, epoch, batch.sequence, batch.records).following


class ProducerStates:
    def __init__(self, snapshot_path: Path, expiry_ms: int) -> None:
        self._path = snapshot_path
        self._expiry_ms = expiry_ms
        self._queues: dict[QueueKey, dict[int, _Producer]] = {}
        self._changed = False  # since the last snapshot (an idle broker writes none)
        self._swept_ms = 0  # store time of the last sweep of idle producers

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    def check(self, key: QueueKey, sequence: BatchSequence, queue_end: int) -> KnownBatch | None:
        """None if the batch is new and may be appended; where it is if it was stored before;
        raises if it must be refused."""
        producer = self._queues.get(key, {}).get(sequence.producer_id)
        if producer is None:
            if sequence.sequence == 0:
                return None
            raise UnknownProducerIdError(
                f"{key[0]}/{key[1]} does not know producer {sequence.producer_id}: its batch "
                f"{sequence.sequence} (epoch {sequence.epoch}) cannot come first, batch 0 does")
        if sequence.epoch < producer.epoch:
            raise ProducerFencedError(
                f"producer {sequence.producer_id} sent a batch of epoch {sequence.epoch} to {key[0]}/{key[1]}, "
                f"which is at epoch {producer.epoch}: the producer gave that batch up")
        batches = producer.batches
        expected = _following(batches[-1], producer.epoch) if batches else 0
        if sequence.epoch > producer.epoch:
            if sequence.sequence == 0:
                return None
            expected = 0  # a new epoch starts at 0
        elif sequence.sequence == expected:
            return None
        else:
            for i, batch in enumerate(batches):
                if batch.sequence == sequence.sequence:
                    stored = max(0, min(batch.records, queue_end - batch.base_offset))
                    if stored:
                        return KnownBatch(batch.base_offset, stored)
                    for _ in range(len(batches) - i):  # lost with the queue's tail: stored afresh
                        batches.pop()
                    return None
            if batches and sequence.sequence < batches[0].sequence:
                raise SequenceTooOldError(
                    f"batch {sequence.sequence} of producer {sequence.producer_id} on {key[0]}/{key[1]} is older "
                    f"than the last {BATCHES_KEPT} batches kept (the next is {expected}): a retry from long ago")
        raise OutOfOrderSequenceError(
            f"{key[0]}/{key[1]} expects batch {expected} of producer {sequence.producer_id} "
            f"(epoch {sequence.epoch}), not {sequence.sequence}")

    def appended(self, key: QueueKey, sequence: BatchSequence, base_offset: int, phys: int, now_ms: int) -> None:
        """A stamped record was stored at ``base_offset``: the first of its batch."""
        producers = self._queues.setdefault(key, {})
        producer = producers.get(sequence.producer_id)
        if producer is None:
            producer = producers[sequence.producer_id] = _Producer(sequence.epoch, now_ms)
        elif sequence.epoch != producer.epoch:
            if sequence.epoch < producer.epoch:
                return  # older than what is known (recovery re-reading what a snapshot holds)
            producer.epoch = sequence.epoch
            producer.batches.clear()
        elif producer.batches and sequence.sequence <= producer.batches[-1].sequence:
            return  # known already (recovery re-reading what a snapshot holds)
        producer.last_ms = max(producer.last_ms, now_ms)
        producer.batches.append(StoredBatch(sequence.sequence, sequence.records, base_offset, phys))
        self._changed = True
        if now_ms - self._swept_ms >= self._expiry_ms // SWEEPS_PER_EXPIRY:
            self._sweep(now_ms)

    def _sweep(self, now_ms: int) -> None:
        """Forget producers idle past the expiry. Here, under the write lock with the appends, never
        on the flush thread: a producer dropped there while an append notes its batch loses it."""
        self._swept_ms = now_ms
        oldest = now_ms - self._expiry_ms
        for key, producers in list(self._queues.items()):
            for producer_id in [pid for pid, producer in producers.items() if producer.last_ms < oldest]:
                del producers[producer_id]
            if not producers:
                del self._queues[key]

    def truncated(self, key: QueueKey, offset: int) -> None:
        """The queue was cut back to ``offset``: batches stored from there on are gone."""
        producers = self._queues.get(key)
        if not producers:
            return
        self._changed = True
        for producer_id, producer in list(producers.items()):
            kept = [b for b in producer.batches if b.base_offset < offset]
            if len(kept) == len(producer.batches):
                continue
            if kept:
                producer.batches.clear()
                producer.batches.extend(kept)
            else:  # what came before those batches is not known: the producer starts afresh
                del producers[producer_id]

    def deleted(self, topic: str) -> None:
        for key in [k for k in self._queues if k[0] == topic]:
            del self._queues[key]
            self._changed = True

    # --- snapshot -----------------------------------------------------------------------------

    def save(self, end_phys: int, now_ms: int) -> None:
        """Write the state of the records below ``end_phys`` (the checkpoint's end), if it changed
        since the last snapshot; producers idle past the expiry are left out (not dropped: the
        flush thread runs this beside the appends)."""
        if not self._changed:
            return
        self._changed = False  # an append from now on marks it again (the flush thread saves)
        oldest = now_ms - self._expiry_ms
        queues: dict[str, dict[int, list]] = {}
        for (topic, queue_id), producers in list(self._queues.items()):
            for producer_id, producer in list(producers.items()):
                if producer.last_ms < oldest:
                    continue
                # a copy: the event loop appends while the flush thread saves. Batches are in
                # commitlog order, so all are below the end when the last is (msgpack writes
                # each StoredBatch, a tuple, as an array): thousands of queues are saved every second
                batches = list(producer.batches)
                if batches and batches[-1].phys >= end_phys:
                    batches = [b for b in batches if b.phys < end_phys]
                    self._changed = True  # the rest belongs in the next snapshot
                if batches:
                    queues.setdefault(f"{queue_id}/{topic}", {})[producer_id] = [
                        producer.epoch, producer.last_ms, batches]
        data = msgpack.packb({"v": SNAPSHOT_VERSION, "end": end_phys, "queues": queues})
        try:
            write_atomically(self._path, b"%08x\n%s" % (zlib.crc32(data), data))
            self._path.with_name(JSON_SNAPSHOT_NAME).unlink(missing_ok=True)
        except OSError:
            self._changed = True  # written at the next checkpoint
            raise

    def load(self) -> bool:
        """The last snapshot (none: an empty state, rebuilt from what recovery re-reads). False if
        it is damaged: the state is then empty and only re-reading the whole log rebuilds it."""
        path = self._path
        if not path.exists() and path.with_name(JSON_SNAPSHOT_NAME).exists():
            path = path.with_name(JSON_SNAPSHOT_NAME)
        try:
            crc, data = path.read_bytes().split(b"\n", 1)
            if int(crc, 16) != zlib.crc32(data):
                raise ValueError("CRC mismatch")
            raw = json.loads(data) if data.startswith(b"{") else msgpack.unpackb(data, strict_map_key=False)
            if raw.get("v") not in (SNAPSHOT_VERSION, JSON_SNAPSHOT_VERSION):
                raise ValueError(f"version {raw.get('v')}")
            for name, producers in raw["queues"].items():
                queue_id, topic = name.split("/", 1)
                state = self._queues.setdefault((topic, int(queue_id)), {})
                for producer_id, (epoch, last_ms, batches) in producers.items():
                    producer = state[int(producer_id)] = _Producer(int(epoch), int(last_ms))
                    producer.batches.extend(StoredBatch(*map(int, b)) for b in batches)
        except FileNotFoundError:
            return True
        except (OSError, ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as err:
            log.error("producer state snapshot %s is damaged (%s): rebuilding it from the whole commitlog",
                      path, err)
            self._queues.clear()
            return False
        return True
