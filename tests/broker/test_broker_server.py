"""The broker process over the wire, request by request (the SDK has its own suite)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from gms.errors import (
    BadRequestError,
    BadTagExpressionError,
    InvalidTopicError,
    MessageIllegalError,
    OffsetIllegalError,
    QueueHeldError,
    QueueNotFoundError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnknownCodeError,
)
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C
from gms.protocol.fields import OFFSET_ARRAY, QUEUE_ID_ARRAY, read_int_array
from gms.record import Message, decode_record, encode_batch, encode_record, iter_records


def call(broker, scenario):
    """Run ``scenario(conn)`` against the broker on a fresh connection."""

    async def main():
        conn = await Connection.open("127.0.0.1", broker.port)
        try:
            return await scenario(conn)
        finally:
            conn.close()

    return run(main())


async def create(conn, topic="orders", queues=4):
    await conn.request(C.CREATE_TOPIC, {"topic": topic, "queues": queues})


def batch(topic, n, queue_id=0, tag=None, start=0):
    return encode_batch(
        Message(topic=topic, body=f"m{start + i}".encode(), tag=tag, queue_id=queue_id) for i in range(n)
    )


def test_send_then_pull_returns_stored_records(broker):
    async def scenario(conn):
        await create(conn)
        resp = await conn.request(C.SEND_BATCH, {}, batch("orders", 5, queue_id=2))
        offsets = read_int_array(resp.fields["queue_offsets"], OFFSET_ARRAY)
        assert list(read_int_array(resp.fields["queue_ids"], QUEUE_ID_ARRAY)) == [2] * 5
        assert list(offsets) == [0, 1, 2, 3, 4]
        assert resp.fields["broker"] == broker.address
        pulled = await conn.request(C.PULL, {"topic": "orders", "queue_id": 2, "offset": 1, "max_msgs": 3})
        assert pulled.fields["result"] == "found" and pulled.fields["next_offset"] == 4
        records = list(iter_records(bytes(pulled.body)))
        assert [bytes(r.body) for r in records] == [b"m1", b"m2", b"m3"]
        phys = read_int_array(resp.fields["phys_offsets"], OFFSET_ARRAY)
        viewed = await conn.request(C.VIEW_MESSAGE_BY_ID, {"phys_offset": int(phys[4])})
        assert bytes(decode_record(bytes(viewed.body)).body) == b"m4"
        for code, expected in ((C.QUERY_MIN_OFFSET, 0), (C.QUERY_MAX_OFFSET, 5)):
            assert (await conn.request(code, {"topic": "orders", "queue_id": 2})).fields["offset"] == expected
        by_time = await conn.request(
            C.QUERY_OFFSET_BY_TIME, {"topic": "orders", "queue_id": 2, "timestamp_ms": 0})
        assert by_time.fields["offset"] == 0

    call(broker, scenario)


def test_pull_filters_by_tag(broker):
    async def scenario(conn):
        await create(conn, queues=1)
        body = b"".join(
            encode_record(topic="orders", body=str(i).encode(), tag="A" if i % 3 == 0 else "B")
            for i in range(30)
        )
        await conn.request(C.SEND, {}, body)
        pulled = await conn.request(
            C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "max_msgs": 100, "tags": "A"})
        records = list(iter_records(bytes(pulled.body)))
        assert [r.tag for r in records] == ["A"] * 10
        assert pulled.fields["next_offset"] == 30

    call(broker, scenario)


def test_long_poll_wakes_on_arrival(broker):
    async def scenario(conn):
        await create(conn, queues=1)
        started = time.monotonic()
        waiting = asyncio.create_task(conn.request(
            C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "poll_ms": 10_000}))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await conn.request(C.SEND, {}, batch("orders", 1))
        pulled = await asyncio.wait_for(waiting, 5)
        assert pulled.fields["result"] == "found"
        assert time.monotonic() - started < 5

    call(broker, scenario)


def test_long_poll_times_out_empty(broker):
    async def scenario(conn):
        await create(conn, queues=1)
        started = time.monotonic()
        pulled = await conn.request(C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "poll_ms": 300})
        assert pulled.fields["result"] == "no_new_message" and not pulled.body
        assert 0.25 < time.monotonic() - started < 5

    call(broker, scenario)


@pytest.mark.parametrize("code, fields, body, error", [
    (C.SEND, {}, b"", MessageIllegalError),
    (C.SEND, {}, b"\x00" * 100, MessageIllegalError),
    (C.SEND, {"acks": 7}, b"x", BadRequestError),
    (C.PULL, {"topic": "orders", "queue_id": 0}, b"", BadRequestError),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": "zero"}, b"", BadRequestError),
    (C.PULL, {"topic": "nope", "queue_id": 0, "offset": 0}, b"", TopicNotFoundError),
    (C.PULL, {"topic": "orders", "queue_id": 99, "offset": 0}, b"", QueueNotFoundError),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": 5}, b"", OffsetIllegalError),
    (C.PULL, {"topic": "orders", "queue_id": 0, "offset": 0, "tags": "A ||"}, b"", BadTagExpressionError),
    (C.CREATE_TOPIC, {"topic": "../etc", "queues": 1}, b"", InvalidTopicError),
    (C.CREATE_TOPIC, {"topic": "orders", "queues": 1}, b"", TopicAlreadyExistsError),
    (999, {}, b"", UnknownCodeError),
])
def test_bad_requests_get_typed_errors_and_the_broker_keeps_serving(broker, code, fields, body, error):
    async def scenario(conn):
        await create(conn, queues=1)
        with pytest.raises(error) as info:
            await conn.request(code, fields, body)
        assert str(info.value)
        await conn.request(C.SEND, {}, batch("orders", 1))  # still serving

    call(broker, scenario)


def test_unknown_topic_and_oversized_body_store_nothing(broker):
    async def scenario(conn):
        await create(conn, queues=1)
        good = batch("orders", 3)
        with pytest.raises(TopicNotFoundError):
            await conn.request(C.SEND, {}, good + batch("missing", 1))
        big = encode_record(topic="orders", body=b"x" * (4 * 1024 * 1024 + 1))
        with pytest.raises(MessageIllegalError, match=r"4194304|body"):
            await conn.request(C.SEND, {}, big)  # one record over the body limit
        with pytest.raises(MessageIllegalError, match="SEND_BODY_SIZE_MAX_BYTES"):
            await conn.request(C.SEND, {}, good + big)  # several records over the request limit
        assert (await conn.request(C.QUERY_MAX_OFFSET, {"topic": "orders", "queue_id": 0})).fields["offset"] == 0

    call(broker, scenario)


def test_garbage_bytes_close_that_connection_only(broker):
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(b"\xff\xff\xff\xff" + b"garbage" * 100)
        sock.settimeout(5)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    async def scenario(conn):
        await create(conn, queues=1)
        await conn.request(C.SEND, {}, batch("orders", 1))

    call(broker, scenario)


def test_consumer_group_offsets_survive_restart(broker):
    async def commit(conn):
        await create(conn, queues=2)
        await conn.request(C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 1, 42]]})
        got = await conn.request(C.FETCH_OFFSET, {"group": "g", "queues": [["orders", 1], ["orders", 0]]})
        assert got.fields["offsets"] == [42, -1]

    call(broker, commit)
    broker.stop()
    broker.restart()

    async def fetch(conn):
        got = await conn.request(C.FETCH_OFFSET, {"group": "g", "queues": [["orders", 1]]})
        assert got.fields["offsets"] == [42]

    call(broker, fetch)


def test_heartbeat_assigns_queues_and_pull_enforces_ownership(broker):
    async def scenario(conn):
        await create(conn, queues=4)
        hb = {"group": "g", "mode": "clustering", "subscription": {"orders": "*"}}
        a = await conn.request(C.HEARTBEAT, {**hb, "member": "a"})
        assert a.fields["assignment"] == {"orders": [0, 1, 2, 3]}
        b = await conn.request(C.HEARTBEAT, {**hb, "member": "b"})
        assert b.fields["assignment"] == {"orders": []}
        pull = {"topic": "orders", "queue_id": 3, "offset": 0, "group": "g"}
        await conn.request(C.PULL, {**pull, "member": "a"})  # a reads queue 3: it is a's on this leader
        with pytest.raises(QueueHeldError, match="still read by member 'a'"):
            await conn.request(C.PULL, {**pull, "member": "b"})
        with pytest.raises(QueueHeldError):
            await conn.request(C.COMMIT_OFFSET, {"group": "g", "member": "b", "offsets": [["orders", 3, 1]]})
        await conn.request(C.HEARTBEAT, {**hb, "member": "a", "held": [["orders", 0], ["orders", 1]]})
        b = await conn.request(C.HEARTBEAT, {**hb, "member": "b"})
        assert b.fields["assignment"] == {"orders": [2, 3]}
        await conn.request(C.COMMIT_OFFSET, {"group": "g", "member": "a", "offsets": [], "release": [["orders", 3]]})
        await conn.request(C.PULL, {**pull, "member": "b"})  # released: b reads it now
        described = await conn.request(C.GET_CONSUMER_GROUP_MEMBERS, {"group": "g"})
        assert sorted(m["member"] for m in described.fields["members"]) == ["a", "b"]
        with pytest.raises(TopicNotFoundError):
            await conn.request(C.HEARTBEAT, {**hb, "member": "c", "subscription": {"nope": "*"}})

    call(broker, scenario)


def test_sync_flush_acknowledged_messages_survive_sigkill_mid_stream(broker_factory):
    broker = broker_factory("--flush", "sync")
    acked: list[int] = []  # batches acknowledged before the kill

    async def produce(conn):
        await create(conn, queues=1)
        killer = asyncio.get_running_loop().run_in_executor(None, lambda: (time.sleep(0.5), broker.kill()))
        try:
            for i in range(100_000):
                await conn.request(C.SEND, {}, batch("orders", 5, start=i * 5))
                acked.append(i)
        except ConnectionError:
            pass
        await killer

    call(broker, produce)
    assert len(acked) > 10
    broker.restart()

    async def verify(conn):
        records = []
        offset = 0
        while True:
            pulled = await conn.request(C.PULL, {"topic": "orders", "queue_id": 0, "offset": offset, "max_msgs": 256})
            if pulled.fields["result"] != "found":
                break
            records.extend(iter_records(bytes(pulled.body)))
            offset = pulled.fields["next_offset"]
        expected = len(acked) * 5
        assert len(records) >= expected
        assert [bytes(r.body) for r in records[:expected]] == [f"m{i}".encode() for i in range(expected)]
        assert [r.queue_offset for r in records] == list(range(len(records)))

    call(broker, verify)
