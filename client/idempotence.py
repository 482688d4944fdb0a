"""The idempotent producer's side of Kafka's KIP-98: an id, and per queue an epoch and a batch count.

Every request body a producer sends is one batch, stamped (:func:`stamp_sequence`) with the
producer id, the queue's epoch and the batch's number in it, and sent and retried as is: a broker
that stored it already answers with where it is instead of storing it again
(docs/idempotence.md). The id comes from the nameservers (a counter in etcd); a producer given a
fixed broker list draws a random 63-bit id instead. A batch given up (its retries exhausted, or
moved to another queue) leaves a gap its queue's later batches cannot pass: the queue's epoch is
bumped and its count restarts at 0, which the brokers accept.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Awaitable, Callable

from gms.record.sequence import BatchSequence, stamp_sequence

# Batches of one queue in flight at once (Kafka's max.in.flight.requests.per.connection with
# idempotence): the brokers keep the last 16 of each producer per queue, so a retry always finds its own.
IN_FLIGHT_PER_QUEUE = 5

QueueKey = tuple[str, int]


def random_producer_id() -> int:
    return secrets.randbits(63) or 1


class Sequencer:
    """Numbers an idempotent producer's batches. Stamping is thread-safe (sync sends stamp on the
    caller's thread, batched sends on the I/O loop)."""

    def __init__(self, allocate_id: Callable[[], Awaitable[int]]) -> None:
        self._allocate_id = allocate_id
        self._producer_id: int | None = None
        self._id_lock: asyncio.Lock | None = None
        self._lock = threading.Lock()
        self._queues: dict[QueueKey, list[int]] = {}  # [epoch, next batch number]
        self._in_flight: dict[QueueKey, asyncio.Semaphore] = {}

    @property
    def producer_id(self) -> int | None:
        return self._producer_id

    async def ready(self) -> None:
        """Get the producer id (once; on the I/O loop)."""
        if self._producer_id is not None:
            return
        if self._id_lock is None:
            self._id_lock = asyncio.Lock()
        async with self._id_lock:
            if self._producer_id is None:
                self._producer_id = await self._allocate_id()

    def stamp(self, body: bytearray, topic: str, queue_id: int, count: int) -> BatchSequence:
        """Number ``body`` (``count`` records) as the queue's next batch. Call :meth:`ready` first."""
        assert self._producer_id is not None, "Sequencer.ready() first"
        with self._lock:
            state = self._queues.setdefault((topic, queue_id), [0, 0])
            sequence = BatchSequence(self._producer_id, state[0], state[1], count)
            state[1] += 1
        stamp_sequence(body, sequence)
        return sequence

    def gave_up(self, topic: str, queue_id: int, sequence: BatchSequence) -> None:
        """The batch will never be stored on its queue: later batches start a new epoch there."""
        with self._lock:
            state = self._queues.get((topic, queue_id))
            if state is not None and state[0] == sequence.epoch:
                state[0] += 1
                state[1] = 0

    def in_flight(self, topic: str, queue_id: int) -> asyncio.Semaphore:
        """Held while a batch of the queue is being sent (on the I/O loop)."""
        semaphore = self._in_flight.get((topic, queue_id))
        if semaphore is None:
            semaphore = self._in_flight[(topic, queue_id)] = asyncio.Semaphore(IN_FLIGHT_PER_QUEUE)
        return semaphore
