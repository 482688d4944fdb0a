"""Sending sealed batches: one SEND_BATCH request per target queue, retried with backoff on
retriable errors, in the order of the idempotent producer's batches (client/idempotence.py), and
followed to a queue's new leader. The answers as :class:`SendResult` sequences.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from gms.client.connections import msg_id_prefix
from gms.client.idempotence import Sequencer, Ticket
from gms.client.routing import UNREACHABLE_ERRORS, BrokerFaults, QueueRoute, leader_request
from gms.client.runtime import ClientRuntime
from gms.client.structs import SendResult, SendResults
from gms.errors import (
    STORED_FIELD,
    GmsError,
    NotEnoughReplicasError,
    NotLeaderError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    QueueNotFoundError,
    ServerBusyError,
    ServiceUnavailableError,
    TopicNotFoundError,
    UnknownProducerIdError,
)
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame
from gms.record import OFF_QUEUE_ID
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
                        if not sequencer.may_go(ticket):
                            await sequencer.turn(ticket)
                        if ticket.sequence != stamped:  # its lane started a new epoch
                            stamped = ticket.sequence
                            body = bytearray(body)  # an abandoned attempt's write may still hold the old
                            stamp_sequence(body, stamped)
                        oldest = ticket.oldest
                    if acks == 0:
                        await self._runtime.pool.oneway(route.broker, RequestCode.SEND_BATCH, {"acks": 0}, body)
                        return []
                    frame = await self._request(route, acks, body)
                except (TopicNotFoundError, QueueNotFoundError) as err:
                    # The route may be newer than the broker's queues (created a moment ago) or stale.
                    if attempt >= self._retries or not await self._still_routed(route):
                        raise
                    if ticket is not None:
                        sequencer.failed(ticket)
                    log.debug("%s not on %s yet (%r), retry %d", route, route.broker, err, attempt + 1)
                except GmsError as err:
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
                    if ticket is not None:
                        sequencer.acked(ticket)
                    return results(route.topic, frame.fields)
                self._runtime.routes.invalidate()
                await asyncio.sleep(self._retry_backoff_s * (attempt + 1))
                attempt += 1
                # A batch that may be stored on a replicated queue waits there for the new leader,
                # which answers a retry of a stored batch with where it is (exactly once); one of an
                # unreplicated queue whose broker is gone moves on (docs/idempotence.md).
                moved = await self._reroute(route, body, movable and not (maybe_stored and route.replicated))
                if ticket is not None and moved.queue_id != route.queue_id:
                    sequencer.gave_up(ticket, maybe_stored)
                    ticket = sequencer.stamp(body, moved.topic, moved.queue_id, ticket.sequence.records)
                    stamped = ticket.sequence
                route = moved
        except BaseException as err:
            if ticket is not None:
                sequencer.gave_up(ticket, maybe_stored or not isinstance(err, NOT_STORED_ERRORS))
            raise

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
            async with sequencer.in_flight(route.topic, route.queue_id):
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
