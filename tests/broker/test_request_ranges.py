"""Integers that do not fit their wire width get BAD_REQUEST naming the field, over a real
socket to a running broker; never a struct/numpy message or an internal error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gms.client import Producer
from gms.errors import BadRequestError, QueueNotFoundError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C
from gms.protocol.fields import INT32, INT64, field
from gms.protocol.groups import QUEUE_OFFSET

I32, I64, U64_MAX = 1 << 31, 1 << 63, (1 << 64) - 1  # msgpack carries ints up to 2^64 - 1

CASES = [
    (C.PULL, {"topic": "orders", "queue_id": I32, "offset": 0}, "queue_id"),
    (C.PULL, {"topic": "orders", "queue_id": -I32 - 1, "offset": 0}, "queue_id"),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": I64}, "offset"),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "max_msgs": U64_MAX}, "max_msgs"),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "poll_ms": I64}, "poll_ms"),
    (C.QUERY_MIN_OFFSET, {"topic": "orders", "queue_id": U64_MAX}, "queue_id"),
    (C.QUERY_MAX_OFFSET, {"topic": "orders", "queue_id": I32}, "queue_id"),
    (C.QUERY_OFFSET_BY_TIME, {"topic": "orders", "queue_id": 0, "timestamp_ms": I64}, "timestamp_ms"),
    (C.VIEW_MESSAGE_BY_ID, {"phys_offset": U64_MAX}, "phys_offset"),
    (C.SEND, {"acks": I32}, "acks"),
    (C.CREATE_TOPIC, {"topic": "big", "queues": I64}, "queues"),
    (C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 0, 1], ["orders", I32, 0]]}, "queue_id"),
    (C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 0, I64]]}, "offset"),
    (C.FETCH_OFFSET, {"group": "g", "queues": [["orders", U64_MAX]]}, "queue_id"),
]


def test_out_of_range_integers_are_bad_requests_naming_the_field(broker):
    async def scenario() -> list[tuple[str, BaseException | None]]:
        conn = await Connection.open("127.0.0.1", broker.port)
        try:
            await conn.request(C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
            answers = []
            for code, fields, _ in CASES:
                try:
                    await conn.request(code, fields, b"x" if code == C.SEND else b"")
                    answers.append(None)
                except Exception as err:  # noqa: BLE001 - collected and checked below
                    answers.append(err)
            # The connection and the broker are fine afterwards.
            await conn.request(C.QUERY_MAX_OFFSET, {"topic": "orders", "queue_id": 1})
            return answers
        finally:
            conn.close()

    for (code, fields, name), err in zip(CASES, run(scenario()), strict=True):
        assert isinstance(err, BadRequestError), (code.name, fields, err)
        assert name in str(err) and "outside int" in str(err), (code.name, str(err))
        assert "struct" not in str(err) and "internal" not in str(err)


@given(st.integers(min_value=-(1 << 70), max_value=1 << 70))
def test_a_checked_int_always_packs(value):
    for width, code in ((INT32, ">i"), (INT64, ">q")):
        try:
            checked = field({"queue_id": value}, "queue_id", width)
        except BadRequestError as err:
            assert "'queue_id'" in str(err) and not width.low <= value <= width.high
        else:
            assert struct.unpack(code, struct.pack(code, checked))[0] == value


@pytest.mark.parametrize("row, message", [
    (["t", 1], "must hold rows of [topic, queue_id, offset]"),
    (["t", 1, 2, 3], "must hold rows of"),
    ([1, 1, 2], "must hold rows of"),
    ("t", "must hold rows of"),
    (["t", True, 2], "'offsets: queue_id' must be int, not bool"),
    (["t", 1, I64], "'offsets: offset' is 9223372036854775808, outside int64"),
])
def test_topic_rows_name_what_is_wrong(row, message):
    with pytest.raises(BadRequestError) as caught:
        QUEUE_OFFSET.decode(row, "offsets")
    assert message in str(caught.value)


def test_producer_refuses_a_queue_id_that_does_not_fit(broker):
    async def create() -> None:
        conn = await Connection.open("127.0.0.1", broker.port)
        try:
            await conn.request(C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
        finally:
            conn.close()

    run(create())
    with Producer(brokers=[broker.address]) as producer, pytest.raises(QueueNotFoundError, match=f"no queue {I32}"):
        producer.send("orders", b"x", queue=I32)
