"""The one error root of gms: every typed error carries a wire status and a retry hint.

Servers map exceptions to statuses at their edge (``err.status``, ``str(err)``,
``err.fields``); clients map a non-success response back to the same class with
:func:`error_for_status`, so ``except TopicNotFoundError`` works on both sides of
the wire. ``retriable`` tells a client whether the same request may succeed later
(after a backoff, a reconnect or a route refresh).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.protocol.codes import Status

# An error field: the send's batch was stored before the request failed (a leader that lost its
# leadership, or its ISR, while waiting for replicas). A retry must stay on the batch's queue,
# where an idempotent producer's retry is recognised; moved to another queue it is stored twice.
STORED_FIELD = "stored"


class GmsError(Exception):
    """Base of all gms errors; ``status`` maps to a wire status code, ``retriable`` tells clients
    whether the same request may succeed later."""

    status: int = Status.SYSTEM_ERROR
    retriable: bool = False

    def __init__(self, message: str = "", *, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Response fields that came with the error (for example the current leader of a queue
        # with NOT_LEADER); empty when raised locally.
        self.fields: Mapping[str, Any] = fields if fields is not None else {}


# --- server condition -----------------------------------------------------------------------


class ServerError(GmsError):
    """The server failed while handling the request (a bug or an I/O failure on its side)."""

    status = Status.SYSTEM_ERROR


class ServerBusyError(GmsError):
    """The server sheds load (queues full, flush behind); back off and retry."""

    status = Status.SYSTEM_BUSY
    retriable = True


class RequestTimeoutError(GmsError, TimeoutError):
    """No answer within the deadline; the request may or may not have taken effect."""

    status = Status.TIMEOUT
    retriable = True


class ServiceUnavailableError(GmsError):
    """The service cannot take requests now (starting, stopping, unreachable)."""

    status = Status.SERVICE_UNAVAILABLE
    retriable = True


class ConnectionClosedError(GmsError, ConnectionError):
    """The connection closed before the response arrived; raised locally, never sent."""

    status = Status.CONNECTION_CLOSED
    retriable = True


# --- the frame or request is wrong ------------------------------------------------------------


class BadRequestError(GmsError):
    """A header field is missing, has the wrong type or an out-of-range value."""

    status = Status.BAD_REQUEST


class ProtocolError(GmsError):
    """The byte stream does not follow the frame format.

    ``must_close`` is true when framing is lost (the next frame boundary is unknown), so the
    connection must be closed after answering; false when the bad frame was skipped whole and
    the stream can go on. ``request_id`` is the id of the bad frame when it could be read.
    """

    status = Status.MALFORMED_FRAME

    def __init__(
        self,
        message: str = "",
        *,
        must_close: bool = True,
        request_id: int | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, fields=fields)
        self.must_close = must_close
        self.request_id = request_id


class MalformedFrameError(ProtocolError):
    """Lengths disagree, or the header is not a valid msgpack map of the expected types."""

    status = Status.MALFORMED_FRAME


class FrameTooLargeError(ProtocolError):
    """A frame or header length exceeds the receiver's limit."""

    status = Status.FRAME_TOO_LARGE


class UnknownCodeError(GmsError):
    """The server has no handler for the request code."""

    status = Status.UNKNOWN_CODE


# --- topics, queues, messages -----------------------------------------------------------------


class TopicNotFoundError(GmsError):
    """The topic does not exist on this server."""

    status = Status.TOPIC_NOT_FOUND


class QueueNotFoundError(GmsError):
    """The topic exists but has no queue with that id."""

    status = Status.QUEUE_NOT_FOUND


class InvalidTopicError(GmsError):
    """The topic name or topic settings break the rules (characters, length, queue count)."""

    status = Status.INVALID_TOPIC


class TopicAlreadyExistsError(GmsError):
    """A create asked for a topic that already exists."""

    status = Status.TOPIC_ALREADY_EXISTS


class MessageIllegalError(GmsError):
    """A message or batch body is malformed, fails its CRC or exceeds the size limit."""

    status = Status.MESSAGE_ILLEGAL


class BadTagExpressionError(GmsError):
    """A subscription tag expression does not parse."""

    status = Status.BAD_TAG_EXPRESSION


class OffsetIllegalError(GmsError):
    """A queue offset is outside the queue (below its minimum or beyond its end)."""

    status = Status.OFFSET_ILLEGAL


class MessageNotFoundError(GmsError):
    """No message at that id (deleted by retention, or never written)."""

    status = Status.MESSAGE_NOT_FOUND


class OutOfOrderSequenceError(GmsError):
    """An idempotent producer's batch is not the next one the broker expects from it on that queue
    (an earlier batch is still on its way: retried, it lands after it)."""

    status = Status.OUT_OF_ORDER_SEQUENCE
    retriable = True


class UnknownProducerIdError(GmsError):
    """An idempotent producer's batch numbered past 0 on a queue whose broker knows nothing of that
    producer: an earlier batch is on its way (retried, it comes first), or the broker forgot the
    producer (idle past the expiry, its batches cut) and the producer starts the queue again at 0
    under a new epoch (Kafka's UNKNOWN_PRODUCER_ID, KIP-360)."""

    status = Status.UNKNOWN_PRODUCER_ID
    retriable = True


class ProducerFencedError(GmsError):
    """An idempotent producer's batch of an epoch older than the one the broker knows: the producer
    gave that batch up already (docs/idempotence.md)."""

    status = Status.PRODUCER_FENCED


class SequenceTooOldError(ProducerFencedError):
    """A batch numbered before the last ones the broker keeps of its producer on that queue: a
    retry from long ago, stored then (Kafka's DUPLICATE_SEQUENCE_NUMBER). On gms's wire it is
    PRODUCER_FENCED."""


class DuplicateBatchError(GmsError):
    """A send of an idempotent producer's batches for several queues holds one the broker stored
    before (``fields``: its ``topic`` and ``queue_id``): nothing of the send was stored. Sent alone,
    each batch is stored, or answered with where it was stored (docs/idempotence.md)."""

    status = Status.DUPLICATE_BATCH
    retriable = True


class TransactionNotFoundError(GmsError):
    """No open transaction with that id on this broker: never begun here, lost, or already
    decided the other way (``fields["state"]``: ``committed`` / ``rolled_back`` when known)."""

    status = Status.TRANSACTION_NOT_FOUND


# --- consumer groups --------------------------------------------------------------------------


class GroupNotFoundError(GmsError):
    """The consumer group is unknown to this broker."""

    status = Status.GROUP_NOT_FOUND


class NotCoordinatorError(GmsError):
    """This broker does not coordinate the group; ``fields["coordinator"]`` names the one that
    does (when known). Find the coordinator again and retry."""

    status = Status.NOT_COORDINATOR
    retriable = True


class QueueHeldError(GmsError):
    """Another member of the group still reads the queue (its hand-off is not done); retry."""

    status = Status.QUEUE_HELD
    retriable = True


class ReceiptHandleExpiredError(GmsError):
    """A popped message's receipt handle no longer holds: its invisibility ran out and it was
    handed out again (the newer delivery is the one to acknowledge), or the queue's leader does
    not know it (it moved). The message comes again; do not retry with this handle."""

    status = Status.RECEIPT_HANDLE_EXPIRED


class GroupNotEmptyError(GmsError):
    """The consumer group has live members, so its offsets are not changed or deleted (they
    would commit over the change); stop them first, or force."""

    status = Status.GROUP_NOT_EMPTY


# --- replication and durability ---------------------------------------------------------------


class NotLeaderError(GmsError):
    """This broker does not lead the queue; refresh the route and retry."""

    status = Status.NOT_LEADER
    retriable = True


class NotEnoughReplicasError(GmsError):
    """acks=all and the in-sync replica set is below its minimum size."""

    status = Status.NOT_ENOUGH_REPLICAS
    retriable = True


class NotEnoughReplicasAfterAppendError(GmsError):
    """acks=all and the in-sync replica set fell below its minimum size while the leader waited
    for it: the batch is stored on the leader (a retry must stay on its queue, where an idempotent
    producer's retry is recognised; moved elsewhere it would be stored twice)."""

    status = Status.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    retriable = True


class FlushTimeoutError(GmsError):
    """Sync flush did not complete in time; the message may be stored (retry may duplicate)."""

    status = Status.FLUSH_TIMEOUT
    retriable = True


class FencedLeaderEpochError(GmsError):
    """The request carries a stale leader epoch; the sender must refresh its view."""

    status = Status.FENCED_LEADER_EPOCH


# --- security -----------------------------------------------------------------------------------


class UnauthenticatedError(GmsError):
    """The connection has no identity yet (authenticate first) or its credentials were refused."""

    status = Status.UNAUTHENTICATED


class ForbiddenError(GmsError):
    """The authenticated identity may not do this; ``fields`` name the ``principal``, the
    ``resource`` (``topic orders``, ``group billing``, ``the cluster``) and the ``operation``."""

    status = Status.FORBIDDEN


_ERROR_FOR_STATUS: dict[int, type[GmsError]] = {
    cls.status: cls
    for cls in (
        ServerError,
        ServerBusyError,
        RequestTimeoutError,
        ServiceUnavailableError,
        ConnectionClosedError,
        BadRequestError,
        MalformedFrameError,
        FrameTooLargeError,
        UnknownCodeError,
        TopicNotFoundError,
        QueueNotFoundError,
        InvalidTopicError,
        TopicAlreadyExistsError,
        MessageIllegalError,
        BadTagExpressionError,
        OffsetIllegalError,
        MessageNotFoundError,
        OutOfOrderSequenceError,
        UnknownProducerIdError,
        ProducerFencedError,
        DuplicateBatchError,
        TransactionNotFoundError,
        GroupNotFoundError,
        NotCoordinatorError,
        QueueHeldError,
        ReceiptHandleExpiredError,
        GroupNotEmptyError,
        NotLeaderError,
        NotEnoughReplicasError,
        NotEnoughReplicasAfterAppendError,
        FlushTimeoutError,
        FencedLeaderEpochError,
        UnauthenticatedError,
        ForbiddenError,
    )
}
assert set(_ERROR_FOR_STATUS) == set(Status) - {Status.SUCCESS}, "one error class per status"


def error_for_status(
    status: int, message: str = "", fields: Mapping[str, Any] | None = None
) -> GmsError:
    """The error a client raises for a non-success response status.

    A status this version does not know (a newer server) becomes a plain :class:`GmsError`
    carrying that number, so nothing is lost.
    """
    cls = _ERROR_FOR_STATUS.get(status)
    if cls is not None:
        return cls(message, fields=fields)
    err = GmsError(message or f"unknown status {status}", fields=fields)
    err.status = status
    return err
