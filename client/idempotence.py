"""The idempotent producer's side of Kafka's KIP-98: an id, and per queue an epoch and a batch count.

Every request body a producer sends is one batch, stamped (:func:`stamp_sequence`) with the
producer id, the queue's epoch and the batch's number in it: a broker that stored it already
answers a retry with where it is instead of storing it again, and stores a queue's batches only in
the order they were numbered (docs/idempotence.md). The id comes from the nameservers (a counter in
etcd); a producer given a fixed broker list draws a random 63-bit id instead.

Order: each queue is a :class:`_Lane` of the batches numbered and not yet acknowledged, oldest
first. First attempts go out at once (up to ``IN_FLIGHT_PER_QUEUE`` requests pipelined); a batch
that failed is sent again only once it is the oldest of its lane, and while one waits so do the
lane's new batches, so a retry never overtakes an earlier batch, nor a later one it. When the
oldest batch cannot be stored with its number (the broker forgot the producer:
``UNKNOWN_PRODUCER_ID``; or expects an earlier batch that will never come: ``OUT_OF_ORDER_SEQUENCE``
for the oldest; or a batch given up before it was stored), the lane starts a new epoch and numbers
its remaining batches from 0 again, in the same order (KIP-360); a batch carries its new number
from its next attempt on.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections import deque
from collections.abc import Awaitable, Callable

from gms.record.sequence import BatchSequence, stamp_sequence

# Batches of one queue in flight at once (Kafka's max.in.flight.requests.per.connection with
# idempotence): the brokers keep the last 16 of each producer per queue, so a retry always finds its own.
IN_FLIGHT_PER_QUEUE = 5

QueueKey = tuple[str, int]


def random_producer_id() -> int:
    return secrets.randbits(63) or 1


class Ticket:
    """A numbered batch of a lane until it is acknowledged or given up: ``first`` is the number
    it was stamped with, ``sequence`` its current one (a new epoch renumbers it), ``failed`` once
    an attempt failed."""

    __slots__ = ("failed", "first", "lane", "sequence")

    def __init__(self, lane: _Lane, sequence: BatchSequence) -> None:
        self.lane = lane
        self.first = self.sequence = sequence
        self.failed = False

    @property
    def oldest(self) -> bool:
        """No earlier batch of its queue is in flight or unacknowledged."""
        return self.lane.outstanding[0] is self


class _Lane:
    __slots__ = ("epoch", "failed", "next", "outstanding", "waiters")

    def __init__(self) -> None:
        self.epoch = 0
        self.next = 0  # the number of the lane's next batch in this epoch
        self.outstanding: list[Ticket] = []  # numbered, not acknowledged nor given up, oldest first
        self.failed = 0  # of them, how many failed an attempt
        self.waiters: list[asyncio.Future[None]] = []  # batches waiting for their turn (on the loop)


class Sequencer:
    """Numbers an idempotent producer's batches and orders their retries. Thread-safe (sync sends
    stamp and finish on the caller's thread, batched sends on the I/O loop ``loop``)."""

    def __init__(self, allocate_id: Callable[[], Awaitable[int]], loop: asyncio.AbstractEventLoop) -> None:
        self._allocate_id = allocate_id
        self._loop = loop
        self._producer_id: int | None = None
        self._id_lock: asyncio.Lock | None = None
        self._lock = threading.Lock()
        self._lanes: dict[QueueKey, _Lane] = {}
        self._in_flight: dict[QueueKey, QueueSlots] = {}

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

    def number(self, topic: str, queue_id: int, count: int) -> Ticket:
        """The queue's next batch (``count`` records), for its first record to be stamped with
        (``BatchBuilder.seal(stamp=...)``, or :meth:`stamp`). Call :meth:`ready` first."""
        assert self._producer_id is not None, "Sequencer.ready() first"
        with self._lock:
            lane = self._lanes.get((topic, queue_id))
            if lane is None:
                lane = self._lanes[(topic, queue_id)] = _Lane()
            ticket = Ticket(lane, BatchSequence(self._producer_id, lane.epoch, lane.next, count))
            lane.next += 1
            lane.outstanding.append(ticket)
        return ticket

    def stamp(self, body: bytearray, topic: str, queue_id: int, count: int) -> Ticket:
        """Number ``body`` (``count`` records) as the queue's next batch. Call :meth:`ready` first."""
        ticket = self.number(topic, queue_id, count)
        stamp_sequence(body, ticket.sequence)
        return ticket

    def may_go(self, ticket: Ticket) -> bool:
        """Whether an attempt of the batch may be sent now: its first while no batch of its lane
        waits to be retried, any once it is the oldest of its lane."""
        lane = ticket.lane
        return (not ticket.failed and not lane.failed) or ticket.oldest

    async def turn(self, ticket: Ticket) -> None:
        """Wait until an attempt of the batch may be sent (:meth:`may_go`; on the I/O loop)."""
        while True:
            with self._lock:  # a batch done on another thread wakes the waiters it finds
                if self.may_go(ticket):
                    return
                waiter = self._loop.create_future()
                ticket.lane.waiters.append(waiter)
            await waiter

    def failed(self, ticket: Ticket) -> None:
        """An attempt of the batch failed: it is sent again in its turn."""
        with self._lock:
            if not ticket.failed:
                ticket.failed = True
                ticket.lane.failed += 1

    def restart(self, ticket: Ticket) -> None:
        """The oldest batch cannot be stored with its number: a new epoch from 0 for the lane."""
        with self._lock:
            if ticket.sequence.epoch == ticket.lane.epoch:
                self._renumber(ticket.lane)

    def acked(self, ticket: Ticket) -> None:
        """The batch is stored: the next one's turn."""
        self._done(ticket, restart=False)

    def gave_up(self, ticket: Ticket, maybe_stored: bool) -> None:
        """The batch will not be sent again on its queue. If it was not stored, the lane's later
        batches cannot pass the gap it leaves: they are numbered from 0 under a new epoch. If it
        may have been, they keep their numbers (their broker says which it is)."""
        self._done(ticket, restart=not maybe_stored)

    def acked_many(self, tickets: list[Ticket]) -> None:
        """:meth:`acked` of the batches one send of several queues' batches stored (one lock for all)."""
        with self._lock:
            waiters = [waiter for ticket in tickets for waiter in self._finish(ticket, restart=False)]
        self._wake(waiters)

    def _done(self, ticket: Ticket, restart: bool) -> None:
        with self._lock:
            waiters = self._finish(ticket, restart)
        self._wake(waiters)

    def _finish(self, ticket: Ticket, restart: bool) -> list[asyncio.Future[None]]:
        """Take the batch out of its lane (under the lock); the batches waiting for their turn there."""
        lane = ticket.lane
        try:
            lane.outstanding.remove(ticket)
        except ValueError:
            return []  # done before
        if ticket.failed:
            lane.failed -= 1
        if restart and ticket.sequence.epoch == lane.epoch:
            self._renumber(lane)
        waiters, lane.waiters = lane.waiters, []
        return waiters

    def _wake(self, waiters: list[asyncio.Future[None]]) -> None:
        """Wake batches that wait for their turn, from any thread."""
        if not waiters:
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            _wake(waiters)
        else:
            self._loop.call_soon_threadsafe(_wake, waiters)

    def _renumber(self, lane: _Lane) -> None:
        """A new epoch: the outstanding batches are numbered 0, 1, ... in their order (under the lock)."""
        lane.epoch += 1
        for number, ticket in enumerate(lane.outstanding):
            ticket.sequence = ticket.sequence._replace(epoch=lane.epoch, sequence=number)
        lane.next = len(lane.outstanding)

    def in_flight(self, topic: str, queue_id: int) -> QueueSlots:
        """Held while a batch of the queue is being sent (on the I/O loop)."""
        slots = self._in_flight.get((topic, queue_id))
        if slots is None:
            slots = self._in_flight[(topic, queue_id)] = QueueSlots(IN_FLIGHT_PER_QUEUE)
        return slots


class QueueSlots:
    """A queue's batches in flight (on the I/O loop): an asyncio.Semaphore whose free slot is also
    taken without awaiting (:meth:`take`: a send of a thousand queues' batches takes one each).
    A released slot goes to the first waiter, if any."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self._free <= 0 or bool(self._waiters)

    def take(self) -> bool:
        """Take a slot if one is free now (False: none is, or others wait for one)."""
        if self._free <= 0 or self._waiters:
            return False
        self._free -= 1
        return True

    async def acquire(self) -> None:
        if self.take():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as it was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
