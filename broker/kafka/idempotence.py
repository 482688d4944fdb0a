"""Kafka's idempotent producer (KIP-98) on gms's producer sequences (docs/idempotence.md).

InitProducerId gives a producer a new id at epoch 0: from the nameservers' counter, as gms's own
producers get theirs (a broker without nameservers draws a random 63-bit one). Kafka does the same
for a producer without a transactional id, whatever id and epoch it asks to resume (KIP-360's
epoch bump): the new id starts every partition at sequence 0 again.

An idempotent producer's batch carries its id, its epoch and the sequence of its first record on
the partition (Kafka numbers records). Each gms send a batch becomes (one, or several for a batch
larger than a send may be) is stamped (``gms.record.sequence``) with the producer id, the epoch
with ``RECORD_NUMBERED`` set and the sequence of its first record, so the store's producer state
(``broker/store/producer_state.py``) takes a partition's batches only in the producer's order,
answers a retry with where the batch is stored (as Kafka answers a duplicate of its last batches)
and refuses a gap (OUT_OF_ORDER_SEQUENCE_NUMBER). The stamps are in the log, so a follower knows
every producer's last batches before it leads: a retry to a new leader is not stored twice.

Transactions are not served: a transactional id is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(here and in FindCoordinator), which Kafka clients take as fatal at once, where a retriable error
would keep ``init_transactions`` retrying until its timeout.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

from gms.broker.kafka.errors import Err
from gms.broker.kafka.records import BATCH_HEADER, split_batches
from gms.broker.services import Services
from gms.errors import GmsError, MessageIllegalError
from gms.record.sequence import KAFKA_SEQUENCE_WRAP, RECORD_NUMBERED, BatchSequence, stamp_sequence

log = logging.getLogger(__name__)

TRANSACTIONS_REFUSED = "transactions are not supported by gms's Kafka API (docs/kafka-compat.md)"
_MAGIC_AT = 16
_RECORD_SIZE = struct.Struct(">i")  # a gms record's first field: its total size

# (topic, queue id, a batch's bytes, client address) -> the batch's records as gms send bodies
BodiesOf = Callable[[str, int, memoryview, str], Sequence[bytes | bytearray]]


class ProducerIds:
    def __init__(self, services: Services) -> None:
        self.topics = services.topics

    async def init_producer_id(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        none = {"throttle_time_ms": 0, "producer_id": -1, "producer_epoch": -1}
        if req["transactional_id"] is not None:
            log.info("kafka client %s asked for transactional id %r: %s", client, req["transactional_id"],
                     TRANSACTIONS_REFUSED)
            return {**none, "error_code": Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
        try:
            producer_id = await self.topics.new_producer_id()
        except GmsError as err:  # the nameservers are out of reach: the producer asks again
            log.warning("kafka client %s: no producer id: %s", client, err)
            return {**none, "error_code": Err.COORDINATOR_NOT_AVAILABLE}
        return {**none, "error_code": 0, "producer_id": producer_id, "producer_epoch": 0}


def stamped_bodies(topic: str, queue_id: int, data: memoryview | None, client: str,
                   bodies_of: BodiesOf) -> list[bytearray] | None:
    """An idempotent producer's batches for a partition as stamped gms send bodies, in order; None
    when they are not an idempotent producer's (sent unstamped). Malformed: a batch does not
    decode; MessageIllegalError: its producer fields cannot be stamped."""
    if not data:
        return None
    batches = split_batches(data)
    first = _producer(batches[0])
    if first is None or first[0] < 0:
        return None
    bodies: list[bytearray] = []
    for raw in batches:
        fields = _producer(raw)
        if fields is None or fields[:2] != first[:2] or fields[1] < 0 or fields[2] < 0:
            raise MessageIllegalError(f"the batches of {topic}/{queue_id} are not all of producer {first[0]} epoch "
                                      f"{first[1]} with a sequence: {fields}")
        producer_id, epoch, number, count = fields
        parts = bodies_of(topic, queue_id, raw, client)
        for part in parts:
            records = count if len(parts) == 1 else _record_count(part)
            body = bytearray(part)
            try:
                stamp_sequence(body, BatchSequence(producer_id, RECORD_NUMBERED | epoch, number, records))
            except ValueError as err:
                raise MessageIllegalError(f"{topic}/{queue_id}: {err}") from err
            bodies.append(body)
            number = (number + records) % KAFKA_SEQUENCE_WRAP
    return bodies


def _producer(batch: memoryview) -> tuple[int, int, int, int] | None:
    """A v2 batch's producer id, producer epoch, base sequence and record count (None: another magic)."""
    if batch[_MAGIC_AT] != 2:
        return None
    fields = BATCH_HEADER.unpack_from(batch)
    return fields[9], fields[10], fields[11], fields[12]


def _record_count(body: bytes | bytearray) -> int:
    count = pos = 0
    while pos < len(body):
        pos += _RECORD_SIZE.unpack_from(body, pos)[0]
        count += 1
    return count
