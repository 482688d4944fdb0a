"""Sending sealed batches: one SEND_BATCH request per target queue, retried with backoff on
retriable errors, in the order of the idempotent producer's batches (client/idempotence.py), and
followed to a queue's new leader. The answers as :class:`SendResult` sequences.

``send_many`` sends the first attempts of batches of different queues of one broker as one
request (the broker stores them in one append, all or nothing); a batch that request did not
store goes on alone, through ``send``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar, copy_context
from typing import Any, cast

import numpy as np

from gms.client.connections import msg_id_prefix
from gms.client.idempotence import QueueSlots, Sequencer, Ticket
from gms.client.routing import UNREACHABLE_ERRORS, BrokerFaults, QueueRoute, leader_request
from gms.client.runtime import ClientRuntime
from gms.client.send_results import SendResult, SendResults
from gms.errors import (
    STORED_FIELD,
    BadRequestError,
    DuplicateBatchError,
    ForbiddenError,
    GmsError,
    MessageIllegalError,
    NotEnoughReplicasError,
    NotLeaderError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    ProtocolError,
    QueueNotFoundError,
    ServerBusyError,
    ServiceUnavailableError,
    TopicNotFoundError,
    UnauthenticatedError,
    UnknownProducerIdError,
)
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame
from gms.record import OFF_QUEUE_ID
from gms.record.builder import BatchBuilder
from gms.record.sequence import BatchSequence, stamp_sequence

log = logging.getLogger(__name__)

_TOTAL_SIZE = struct.Struct(">i")
_QUEUE_ID = struct.Struct(">i")
_I64 = struct.Struct(">q")  # an offset of a send's answer
# Failures that show a batch was not stored: it may move to another queue. After any other
# (a timeout, a connection lost mid-request) it may have been, so it stays on its queue, where
# the broker recognises it if it was (idempotence).
NOT_STORED_ERRORS = (NotLeaderError, TopicNotFoundError, QueueNotFoundError, ServiceUnavailableError,
                      ServerBusyError, OutOfOrderSequenceError, UnknownProducerIdError, NotEnoughReplicasError)
# A broker's answers that refuse a send before anything of it is stored (an append is all or
# nothing): the batches of a refused send of several may go again at once, each alone.
# Set by the caller of a send (the accumulator, for its requests in flight per broker): called once
# the send's first request is answered or failed, or the send waits for its queue's turn; its
# retries and its waits take no slot of the broker's.
FIRST_ANSWER: ContextVar[Callable[[], None] | None] = ContextVar("first_answer", default=None)
REFUSED_ERRORS = (*NOT_STORED_ERRORS, DuplicateBatchError, ProducerFencedError, ForbiddenError,
                  UnauthenticatedError, MessageIllegalError, BadRequestError)
# What a batch of a send of several gets: its results, its error, or what gives them (sent alone).
_BatchOutcome = Sequence[SendResult] | BaseException | asyncio.Future[Sequence[SendResult]]


class Sender:
    """Sends encoded batches to one queue each, with retries; runs on the I/O loop.

    A retry first refreshes the route: a queue whose leader moved is followed to its new
    broker, and a batch that is not pinned to its queue (no explicit queue, no key) moves to a
    queue of another broker when its broker is unreachable (its records' queue ids, outside
    the CRC, are rewritten)."""

    def __init__(self, runtime: ClientRuntime, faults: BrokerFaults, *, acks: int, retries: int,
                 retry_backoff_ms: float, sequencer: Sequencer | None) -> None:
        self._runtime = runtime
        self._faults = faults
        self.sequencer = sequencer  # None: not idempotent
        self._acks = acks
        self._retries = retries
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._moves = itertools.count()

    async def send(self, route: QueueRoute, body: bytearray, acks: int | None = None, *,
                   movable: bool = False, first_error: GmsError | None = None,
                   ticket: Ticket | None = None) -> SendResults | list[SendResult]:
        """Send ``body`` to ``route`` until acknowledged or out of retries.

        ``first_error``: the first attempt was made elsewhere (on a blocking connection) and
        failed so; retry it here as if it had failed here. ``ticket``: the idempotent producer's
        number of ``body``: its attempts go in the order of its queue's batches (client/idempotence.py)."""
        acks = self._acks if acks is None else acks
        sequencer = cast(Sequencer, self.sequencer)  # set whenever a ticket is given
        stamped = None if ticket is None else ticket.first  # the stamp ``body`` carries
        oldest = False  # the batch's last attempt left when no earlier one of its queue was out
        maybe_stored = False  # a failed attempt may have stored the batch: it must stay on its queue
        attempt = 0  # failed attempts that count against the retries
        try:
            while True:
                try:
                    if first_error is not None:
                        failed, first_error = first_error, None
                        raise failed
                    if ticket is not None:
                        body, stamped = await self._in_turn(ticket, body, stamped)
                        oldest = ticket.oldest
                    if acks == 0:
                        await self._runtime.pool.oneway(route.broker, RequestCode.SEND_BATCH, {"acks": 0}, body)
                        return []
                    frame = await self._request(route, acks, body)
                except (TopicNotFoundError, QueueNotFoundError) as err:
                    answered()
                    # The route may be newer than the broker's queues (created a moment ago) or stale.
                    if attempt >= self._retries or not await self._still_routed(route):
                        raise
                    if ticket is not None:
                        sequencer.failed(ticket)
                    log.debug("%s not on %s yet (%r), retry %d", route, route.broker, err, attempt + 1)
                except GmsError as err:
                    answered()
                    if ticket is not None and self._out_of_turn(ticket, stamped, oldest, err):
                        continue  # sent again in its turn, after the batches before it
                    if not err.retriable or attempt >= self._retries:
                        raise
                    log.debug("send to %s failed (%r), retry %d", route, err, attempt + 1)
                    if isinstance(err, UNREACHABLE_ERRORS):
                        self._faults.failed(route.broker)
                    maybe_stored = (maybe_stored or not isinstance(err, NOT_STORED_ERRORS)
                                    or bool(err.fields.get(STORED_FIELD)))
                else:
                    answered()
                    if ticket is not None:
                        sequencer.acked(ticket)
                    return results(route.topic, frame.fields)
                attempt += 1
                route, moved_ticket = await self._retry_route(route, body, movable, ticket, maybe_stored, attempt)
                if moved_ticket is not ticket:
                    ticket, stamped = moved_ticket, cast(Ticket, moved_ticket).sequence
        except BaseException as err:
            if ticket is not None:
                sequencer.gave_up(ticket, maybe_stored or not isinstance(err, NOT_STORED_ERRORS))
            raise

    async def _in_turn(self, ticket: Ticket, body: bytearray, stamped: BatchSequence | None,
                       ) -> tuple[bytearray, BatchSequence]:
        """Wait until the batch may go (an earlier one of its queue is retried first); the body
        restamped, a copy, if its lane started a new epoch meanwhile, and the stamp it carries."""
        sequencer = cast(Sequencer, self.sequencer)
        if not sequencer.may_go(ticket):
            answered()
            await sequencer.turn(ticket)
        if ticket.sequence != stamped:  # its lane started a new epoch
            stamped = ticket.sequence
            body = bytearray(body)  # an abandoned attempt's write may still hold the old
            stamp_sequence(body, stamped)
        return body, stamped

    async def _retry_route(self, route: QueueRoute, body: bytearray, movable: bool, ticket: Ticket | None,
                           maybe_stored: bool, attempt: int) -> tuple[QueueRoute, Ticket | None]:
        """Where a failed batch goes for its ``attempt``-th retry, after a backoff, and its ticket
        (a new one on another queue). A batch that may be stored on a replicated queue waits
        there for the new leader, which answers a retry of a stored batch with where it is
        (exactly once); one of an unreplicated queue whose broker is gone moves on
        (docs/idempotence.md)."""
        self._runtime.routes.invalidate()
        await asyncio.sleep(self._retry_backoff_s * attempt)
        moved = await self._reroute(route, body, movable and not (maybe_stored and route.replicated))
        if ticket is not None and moved.queue_id != route.queue_id:
            sequencer = cast(Sequencer, self.sequencer)
            sequencer.gave_up(ticket, maybe_stored)
            ticket = sequencer.stamp(body, moved.topic, moved.queue_id, ticket.sequence.records)
        return moved, ticket

    def _out_of_turn(self, ticket: Ticket, stamped: BatchSequence | None, oldest: bool, err: GmsError) -> bool:
        """Whether ``err`` refused the batch only for its place in its queue's order: then it is
        sent again in its turn, without counting against the retries. An earlier batch of the
        queue was on its way (the broker expects it, or does not know the producer yet), or the
        lane started a new epoch while this attempt was out (its old number is fenced). A batch
        refused for its number although it was the ``oldest`` when it left starts that new epoch
        (the broker forgot the producer, or expects a batch that will never come, as after a send
        the broker refused before storing it): numbered 0 then, it goes again without counting
        the attempt. Only a batch 0 refused so counts it (no broker refuses one: a bound, not a
        case)."""
        sequencer = cast(Sequencer, self.sequencer)
        if err.retriable:
            sequencer.failed(ticket)
        renumbered = stamped != ticket.sequence
        if isinstance(err, (OutOfOrderSequenceError, UnknownProducerIdError)):
            if renumbered or not oldest:
                return True
            if ticket.sequence.sequence == 0:
                return False
            log.info("%s; numbering the queue's batches from 0 again under a new epoch", err)
            sequencer.restart(ticket)
            return True
        if isinstance(err, ProducerFencedError) and renumbered:
            sequencer.failed(ticket)
            return True
        return False

    def _request(self, route: QueueRoute, acks: int, body: bytearray) -> Awaitable[Frame]:
        """SEND_BATCH to ``route``'s leader; a replicated queue's is given up once another broker
        leads the queue (its broker lost its lease: paused, cut off), not at the request timeout."""
        runtime = self._runtime
        if not route.replicated:
            return runtime.pool.request(route.broker, RequestCode.SEND_BATCH, {"acks": acks}, body)
        return leader_request(runtime.routes, runtime.pool, route.topic, route.queue_id, route.broker,
                              RequestCode.SEND_BATCH, {"acks": acks}, body)

    async def send_many(self, broker: str, batches: list[tuple[QueueRoute, BatchBuilder, int]],
                        ) -> list[Sequence[SendResult] | BaseException]:
        """Send batches (route, batch, record count) of different queues of ``broker`` as one
        request, each sealed here; per batch, its results or the error it failed with. The
        request carries first attempts only: an idempotent producer's batch goes alone
        (:meth:`send`) when an earlier one of its queue waits for its turn or its queue has
        IN_FLIGHT_PER_QUEUE batches out; the others are sealed with their stamp (one copy). If
        the broker refused the request (nothing of it is stored), each batch is sent again alone
        at once, and meets there the error that was its own; after any other failure (it may be
        stored) each is retried alone as after its own first attempt, on its queue."""
        sequencer = self.sequencer if self._acks else None
        if sequencer is not None:
            await sequencer.ready()
        outcomes: list[_BatchOutcome | None] = [None] * len(batches)
        bodies: list[bytearray] = []
        together: list[tuple[int, Ticket | None, QueueSlots | None]] = []
        for i, (route, batch, count) in enumerate(batches):
            if sequencer is None:
                bodies.append(batch.seal())
                together.append((i, None, None))
                continue
            slots = sequencer.in_flight(route.topic, route.queue_id)
            if not slots.take():
                bodies.append(batch.seal())
                outcomes[i] = _on_its_own(self.send_bodies(route, [(bodies[i], count)]))
                continue
            ticket = sequencer.number(route.topic, route.queue_id, count)
            bodies.append(batch.seal(stamp=ticket.sequence.stamp()))
            if sequencer.may_go(ticket):
                together.append((i, ticket, slots))
            else:
                outcomes[i] = _on_its_own(self._alone(route, bodies[i], ticket, slots))
        if len(together) == 1:  # the others went alone: no request of several
            i, one_ticket, one_slots = together.pop()
            outcomes[i] = asyncio.ensure_future(self._alone(batches[i][0], bodies[i], one_ticket, one_slots))
        elif not together:
            answered()  # no request: each batch waits for its queue
        if together:
            answers = await self._send_together(broker, batches, bodies, together)
            for (i, _, _), answer in zip(together, answers, strict=True):
                outcomes[i] = answer
        futures = [outcome for outcome in outcomes if isinstance(outcome, asyncio.Future)]
        if not all(future.done() for future in futures):
            await asyncio.gather(*futures, return_exceptions=True)
        return [_outcome(outcome) if isinstance(outcome, asyncio.Future) else outcome
                for outcome in cast(list[_BatchOutcome], outcomes)]

    async def _send_together(self, broker: str, batches: list[tuple[QueueRoute, BatchBuilder, int]],
                             bodies: list[bytearray], together: list[tuple[int, Ticket | None, QueueSlots | None]],
                             ) -> list[_BatchOutcome]:
        """The one request of :meth:`send_many`: per batch, its results, its error or what gives them
        (a batch retried alone). The batches it stores are acknowledged together."""
        parts = [bodies[i] for i, _, _ in together]
        try:
            if self._acks == 0:
                await self._runtime.pool.oneway(broker, RequestCode.SEND_BATCH, {"acks": 0}, parts)
                return [[] for _ in together]
            frame = await self._runtime.pool.request(broker, RequestCode.SEND_BATCH, {"acks": self._acks}, parts)
        except GmsError as err:
            answered()
            first_error = None if isinstance(err, REFUSED_ERRORS) and not err.fields.get(STORED_FIELD) else err
            log.debug("a send of %d batches to %s failed (%r): each goes alone", len(together), broker, err)
            return [_on_its_own(self._alone(batches[i][0], bodies[i], ticket, slots, first_error))
                    for i, ticket, slots in together]
        except BaseException:
            for _, ticket, slots in together:
                self._settled(ticket, slots, maybe_stored=True)
            raise
        answered()
        answer = results("", frame.fields)
        counts = [batches[i][2] for i, _, _ in together]
        if len(answer) != sum(counts):
            mismatch = ProtocolError(f"{len(answer)} results for a send of {sum(counts)} messages", must_close=False)
            for _, ticket, slots in together:
                self._settled(ticket, slots, maybe_stored=True)
            return [mismatch for _ in together]
        if self.sequencer is not None:
            self.sequencer.acked_many([ticket for _, ticket, _ in together if ticket is not None])
        prefix, queue_ids, queue_offsets, phys_offsets = answer.arrays()
        split: list[_BatchOutcome] = []
        start = 0
        for (i, _, slots), count in zip(together, counts, strict=True):
            end = start + count
            split.append(SendResults(batches[i][0].topic, answer.broker, prefix, queue_ids[start:end],
                                     queue_offsets[start:end], phys_offsets[start:end]))
            if slots is not None:
                slots.release()
            start = end
        return split

    async def _alone(self, route: QueueRoute, body: bytearray, ticket: Ticket | None,
                     slots: QueueSlots | None, first_error: GmsError | None = None) -> Sequence[SendResult]:
        """``send`` of one numbered batch of :meth:`send_many`, its queue's slot in flight held until done."""
        try:
            return await self.send(route, body, ticket=ticket, first_error=first_error)
        finally:
            if slots is not None:
                slots.release()

    def _settled(self, ticket: Ticket | None, slots: QueueSlots | None, *, maybe_stored: bool) -> None:
        """A batch of a send of several that will not be retried (its queue's slot freed)."""
        if ticket is not None:
            cast(Sequencer, self.sequencer).gave_up(ticket, maybe_stored)
        if slots is not None:
            slots.release()

    async def send_bodies(self, route: QueueRoute, bodies: list[tuple[bytearray, int]], *,
                          movable: bool = False) -> SendResults | list[SendResult]:
        """Send one batch sealed as several request bodies of so many records each
        (``BatchBuilder.seal_counted``) one after the other, so that a retry never reorders them;
        the results of all, in order. An idempotent producer numbers each body as it goes."""
        sequencer = self.sequencer
        if sequencer is None or self._acks == 0:
            answers = [await self.send(route, body, movable=movable) for body, _ in bodies]
        else:
            await sequencer.ready()
            slots = sequencer.in_flight(route.topic, route.queue_id)
            if slots.locked():
                answered()
            async with slots:
                answers = [await self.send(route, body, movable=movable,
                                           ticket=sequencer.stamp(body, route.topic, route.queue_id, count))
                           for body, count in bodies]
        return answers[0] if len(answers) == 1 else joined(answers)

    async def _still_routed(self, route: QueueRoute) -> bool:
        self._runtime.routes.invalidate()
        try:
            return bool(await self._runtime.routes.routes(route.topic))
        except GmsError:
            return False

    async def _reroute(self, route: QueueRoute, body: bytearray, movable: bool) -> QueueRoute:
        """Where to retry ``route``'s batch, after a route refresh (the same route if unsure)."""
        try:
            routes = await self._runtime.routes.routes(route.topic)
        except GmsError as err:
            log.debug("route refresh for %s failed: %r", route.topic, err)
            return route
        if route in routes and self._faults.available(route.broker):
            return route
        if movable:
            moved = self._faults.pick(routes, next(self._moves))
            # Another queue of the same broker gains nothing, and there the batch would be a new
            # one: stored twice if the broker had stored it before.
            if moved.broker != route.broker:
                if moved.queue_id != route.queue_id:
                    set_queue_ids(body, moved.queue_id)
                log.info("moving a batch of %s from %s to %s", route.topic, route.broker, moved.broker)
                return moved
        same_queue = [r for r in routes if r.queue_id == route.queue_id]
        return same_queue[0] if same_queue else route


def answered() -> None:
    """The current send's first request is answered (or it waits): call FIRST_ANSWER, once."""
    hook = FIRST_ANSWER.get()
    if hook is not None:
        FIRST_ANSWER.set(None)
        hook()


def _on_its_own(send: Awaitable[Sequence[SendResult]]) -> asyncio.Future[Sequence[SendResult]]:
    """A task for a batch of send_many sent alone: not the request that holds the caller's slot."""
    context = copy_context()
    context.run(FIRST_ANSWER.set, None)
    return asyncio.get_running_loop().create_task(cast(Any, send), context=context)


def _outcome(future: asyncio.Future[Sequence[SendResult]]) -> Sequence[SendResult] | BaseException:
    """What ``gather(..., return_exceptions=True)`` gives for ``future``, done."""
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception() or future.result()


def set_queue_ids(body: bytearray, queue_id: int) -> None:
    """Rewrite the queue id of every record of a sealed batch (outside the CRC)."""
    pos, end = 0, len(body)
    while pos < end:
        _QUEUE_ID.pack_into(body, pos + OFF_QUEUE_ID, queue_id)
        pos += _TOTAL_SIZE.unpack_from(body, pos)[0]


def results(topic: str, fields: Mapping[str, Any]) -> SendResults:
    broker = fields["broker"]
    return SendResults(topic, broker, msg_id_prefix(broker), np.frombuffer(fields["queue_ids"], ">i4"),
                       np.frombuffer(fields["queue_offsets"], ">i8"),
                       np.frombuffer(fields["phys_offsets"], ">i8"))


def one_result(topic: str, fields: Mapping[str, Any]) -> SendResult:
    """The result of a one-record send, without the arrays of :func:`results` (same values)."""
    phys_offsets = fields["phys_offsets"]
    if len(phys_offsets) != _I64.size:
        return results(topic, fields)[0]
    broker = fields["broker"]
    return SendResult(f"{msg_id_prefix(broker)}{_I64.unpack(phys_offsets)[0]:016X}", topic,
                      _QUEUE_ID.unpack(fields["queue_ids"])[0], _I64.unpack(fields["queue_offsets"])[0], broker)


def joined(answers: Sequence[Sequence[SendResult]]) -> SendResults | list[SendResult]:
    """The results of several requests as one sequence (lazy while all share topic and broker)."""
    first = answers[0]
    if isinstance(first, SendResults) and all(
            isinstance(a, SendResults) and a.topic == first.topic and a.broker == first.broker for a in answers):
        return SendResults.concat(cast(list[SendResults], answers))
    return [result for answer in answers for result in answer]
