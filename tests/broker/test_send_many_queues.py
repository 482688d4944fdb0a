"""One send of an idempotent producer's batches for several queues, on a real broker: each queue's
batch checked in body order and the send stored whole or not at all (a duplicate among them is
refused with DUPLICATE_BATCH naming its queue, a gap with OUT_OF_ORDER_SEQUENCE), then stored in
one append with each batch's offsets in the answer."""

from __future__ import annotations

import numpy as np
import pytest

from gms.client import Admin
from gms.errors import DuplicateBatchError, MessageIllegalError, OutOfOrderSequenceError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch
from gms.record.codec import seal_crc
from gms.record.sequence import BatchSequence, stamp_sequence

pytestmark = pytest.mark.timeout(60)

PRODUCER = 0x5EED
TOPICS = ("many-a", "many-b")


def _batch(topic: str, queue: int, sequence: int, records: int = 2) -> bytearray:
    body = bytearray(encode_batch([Message(topic, b"%s/%d/%d/%d" % (topic.encode(), queue, sequence, i),
                                           queue_id=queue) for i in range(records)]))
    stamp_sequence(body, BatchSequence(PRODUCER, 0, sequence, records))
    return body


def _send(address: str, *batches: bytearray):
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return await conn.request(RequestCode.SEND_BATCH, {"acks": 1}, b"".join(batches), timeout_ms=10_000)
        finally:
            conn.close()
    return run(main())


def _ends(admin: Admin) -> dict[tuple[str, int], int]:
    return {(topic, q["queue_id"]): q["max_offset"] for topic in TOPICS for q in admin.topic_stats(topic)}


def test_a_send_of_several_queues_batches_is_admitted_whole_or_not_at_all(broker):
    with Admin([broker.address]) as admin:
        for topic in TOPICS:
            admin.create_topic(topic, queues=2)
        answer = _send(broker.address, _batch("many-a", 0, 0), _batch("many-b", 1, 0), _batch("many-a", 1, 0))
        assert np.frombuffer(answer.fields["queue_ids"], ">i4").tolist() == [0, 0, 1, 1, 1, 1]
        assert np.frombuffer(answer.fields["queue_offsets"], ">i8").tolist() == [0, 1, 0, 1, 0, 1]
        stored = _ends(admin)
        assert stored == {("many-a", 0): 2, ("many-a", 1): 2, ("many-b", 0): 0, ("many-b", 1): 2}

        # the next batch of one queue beside one sent before: nothing of the send is stored
        with pytest.raises(DuplicateBatchError, match="many-b/1") as refused:
            _send(broker.address, _batch("many-a", 0, 1), _batch("many-b", 1, 0))
        assert (refused.value.fields["topic"], refused.value.fields["queue_id"]) == ("many-b", 1)
        # a gap on the second queue refuses the first queue's good batch too
        with pytest.raises(OutOfOrderSequenceError, match="many-b/1"):
            _send(broker.address, _batch("many-a", 0, 1), _batch("many-b", 1, 2))
        # each queue's records in a row, stamped on the first
        interleaved = encode_batch([Message("many-a", b"x", queue_id=0), Message("many-b", b"y", queue_id=0),
                                    Message("many-a", b"z", queue_id=0)])
        unstamped = bytearray(interleaved)
        stamp_sequence(unstamped, BatchSequence(PRODUCER, 0, 1, 3))
        with pytest.raises(MessageIllegalError, match="in a row"):
            _send(broker.address, unstamped)
        assert _ends(admin) == stored

        # alone, the duplicate is answered with where it is; together, the next batches are stored
        again = _send(broker.address, _batch("many-b", 1, 0))
        assert np.frombuffer(again.fields["queue_offsets"], ">i8").tolist() == [0, 1]
        _send(broker.address, _batch("many-a", 0, 1, records=3), _batch("many-b", 1, 1))
        assert _ends(admin) == {("many-a", 0): 5, ("many-a", 1): 2, ("many-b", 0): 0, ("many-b", 1): 4}


def test_a_bad_stamp_among_several_queues_batches_refuses_the_send(broker):
    """The stamps of a send of many queues' batches are read together: a malformed one, a count
    that is not its batch's, or a sequence out of range refuses the send with the error of a
    batch sent alone, and nothing of it is stored."""
    with Admin([broker.address]) as admin:
        for topic in TOPICS:
            admin.create_topic(topic, queues=2)
        _send(broker.address, _batch("many-a", 0, 0), _batch("many-b", 1, 0))
        stored = _ends(admin)
        upper = _batch("many-b", 1, 1)
        at = upper.index(b"%016x" % PRODUCER)
        upper[at:at + 16] = (b"%016x" % PRODUCER).upper()  # int() would take it, the stamp's format not
        seal_crc(upper)
        with pytest.raises(MessageIllegalError, match="four fixed-width hex numbers"):
            _send(broker.address, _batch("many-a", 0, 1), upper)
        miscounted = bytearray(encode_batch([Message("many-b", b"m", queue_id=1)]))
        stamp_sequence(miscounted, BatchSequence(PRODUCER, 0, 1, 2))
        with pytest.raises(MessageIllegalError, match="holds 1 records, its sequence says 2"):
            _send(broker.address, _batch("many-a", 0, 1), miscounted)
        assert _ends(admin) == stored
        answer = _send(broker.address, _batch("many-a", 0, 1), _batch("many-b", 1, 1, records=3))
        assert np.frombuffer(answer.fields["queue_offsets"], ">i8").tolist() == [2, 3, 2, 3, 4]
