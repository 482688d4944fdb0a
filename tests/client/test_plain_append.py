"""send_async's plain path in C (gms.client._append), and its path for a message routed to a
queue: the records they write are the reference codec's, bad input still gets its typed error,
concurrent senders lose and repeat nothing, and the futures they make are collected like any
other object."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import pytest
from client_helpers import consume
from hypothesis import given, settings
from hypothesis import strategies as st

from gms.client import Consumer, Producer, accumulator
from gms.client.accumulator import Accumulator
from gms.client.routing import QueueRoute
from gms.client.send_results import SendFuture
from gms.errors import InvalidTopicError, MessageIllegalError
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING
from gms.record import encode_record, iter_records
from gms.record.builder import RecordEncoder

# a long topic: a record shape past what a batch copies in (BATCH_CORE_SHAPE_INLINE), read where it lies
LONG_TOPIC = "long-" + "x" * 90
plain = st.tuples(st.sampled_from(["t", "orders", LONG_TOPIC]), st.binary(max_size=300),
                  st.one_of(st.none(), st.sampled_from(["A", "B", "tag-é"])))


@contextlib.contextmanager
def _accumulator(encoder: RecordEncoder, sent: list | None = None, **limits: int) -> Iterator[Accumulator]:
    """An accumulator over a loop that runs only when a test runs it; ``sent`` collects what
    would go to the broker (as with acks=0: no results)."""
    async def send(route, bodies):
        if sent is None:
            raise AssertionError("not sent in this test")
        sent.append((route, bodies))
        return []
    routes = {"t": QueueRoute("t", 3, "127.0.0.1:1"), "orders": QueueRoute("orders", 1, "127.0.0.1:1"),
              LONG_TOPIC: QueueRoute(LONG_TOPIC, 0, "127.0.0.1:1")}
    loop = asyncio.new_event_loop()
    try:
        yield Accumulator(loop, encoder, send, routes.__getitem__, linger_ms=60_000,
                          batch_bytes=limits.get("batch_bytes", 1 << 30), buffer_bytes_max=1 << 30)
    finally:
        loop.close()


def _in_threads(send: Callable[[int], None], threads_n: int) -> None:
    """``send(k)`` in threads k = 0 .. threads_n - 1 at once; returns when all are done."""
    threads = [threading.Thread(target=send, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@settings(max_examples=200)
@given(st.lists(plain, min_size=1, max_size=60), st.sampled_from(["", "127.0.0.1:5"]))
def test_plain_appends_write_the_reference_bytes(messages, born_host):
    """Same topic, tag and length again: the C path (shape cached by the batch); anything new:
    the Python path. Together they must write exactly what the reference codec writes."""
    with _accumulator(RecordEncoder(born_host)) as acc:
        futures = [acc.append_plain(topic, body, tag) for topic, body, tag in messages]
        for topic in {m[0] for m in messages}:
            batch = acc._sticky[topic]
            mine = [m for m in messages if m[0] == topic]
            expected = b"".join(encode_record(topic=t, body=b, tag=g, queue_id=batch.queue_id, born_host=born_host,
                                              born_ts_ms=batch.born_ts_ms) for t, b, g in mine)
            assert bytes(batch.seal()) == expected
            assert [r.body for r in iter_records(expected)] == [b for _, b, _ in mine]
            assert batch.count == len(mine) and batch.size_bytes == len(expected)
            assert [f._index for f in futures if f._batch is batch] == list(range(len(mine)))
        assert acc._buffered_bytes == sum(b.size_bytes for b in acc._sticky.values())


def test_the_fast_path_really_runs():
    """After the first message of a shape, the Python path is not called again."""
    with _accumulator(RecordEncoder()) as acc:
        slow_calls = []
        original = acc._append_plain_slow

        def counting(*args):
            slow_calls.append(args)
            return original(*args)
        acc._append_plain_slow = counting  # type: ignore[method-assign]
        for _ in range(100):
            acc.append_plain("t", b"x" * 50, "A")
        assert len(slow_calls) == 1
        acc.append_plain("t", b"x" * 51, "A")  # a new shape: packed in Python, then cached
        acc.append_plain("t", b"y" * 51, "A")
        acc.append_plain("t", bytearray(b"x" * 50), "A")  # not bytes: Python's path
        assert len(slow_calls) == 3


def test_a_full_batch_is_closed_and_handed_to_the_loop():
    sent: list = []
    with _accumulator(RecordEncoder(), sent, batch_bytes=1000) as acc:
        futures = [acc.append_plain("t", b"z" * 100, None) for _ in range(32)]
        record_bytes = acc._sticky["t"].size_bytes // acc._sticky["t"].count
        assert acc._buffered_bytes == 32 * record_bytes  # sent or not, nothing is answered yet
        open_batch = acc._sticky["t"]
        closed = {id(f._batch): f._batch for f in futures if f._batch is not open_batch}
        assert len(closed) == 5 and not open_batch.closed  # 6 records of 177 bytes per batch
        acc._loop.run_until_complete(asyncio.sleep(0.01))  # the loop sends what filled up
        assert sum(count for _, bodies in sent for _, count in bodies) == 32 - open_batch.count
        assert all(f.done() and f.result() is None for f in futures if f._batch is not open_batch)
        assert acc._buffered_bytes == open_batch.size_bytes  # the answered batches gave their room back
        # the answered batches let their records go (their handles keep them): none are sealed again
        assert all(batch.closed and batch.seal() == b"" and batch.count == 6 for batch in closed.values())


def test_routed_appends_take_the_fast_path_and_write_the_reference_bytes():
    """A message sent to a queue (queue=) without keys or properties: into that queue's open
    batch in C once the batch holds its shape; the Python path (append) otherwise."""
    route = QueueRoute("t", 2, "127.0.0.1:1")
    with _accumulator(RecordEncoder()) as acc:
        python_calls = []
        original = acc.append

        def counting(*args, **kwargs):
            python_calls.append(args)
            return original(*args, **kwargs)
        acc.append = counting  # type: ignore[method-assign]
        messages = [(b"a" * 40, "A")] * 50 + [(b"b" * 41, None)] * 50
        futures = [acc.append_open(route, body, tag) for body, tag in messages]
        assert len(python_calls) == 2  # the batch opened, then a second shape packed
        batch = acc._open[route]
        expected = b"".join(encode_record(topic="t", body=b, tag=g, queue_id=2, born_ts_ms=batch.born_ts_ms)
                            for b, g in messages)
        assert bytes(batch.seal()) == expected
        assert [f._index for f in futures] == list(range(100)) and {f._batch for f in futures} == {batch}


def test_bad_plain_messages_get_their_typed_errors_on_the_fast_path(broker, topic):
    with Producer([broker.address], linger_ms=60_000) as producer:
        producer.send_async(topic, b"ok")  # the topic now has a sticky batch: the C path is armed
        with pytest.raises(TypeError, match="bytes-like"):
            producer.send_async(topic, "text")  # type: ignore[arg-type]
        with pytest.raises(MessageIllegalError, match="exceeds the limit"):
            producer.send_async(topic, b"x" * (MESSAGE_SIZE_BYTES_MAX_CEILING + 1))
        with pytest.raises(InvalidTopicError):
            producer.send_async("bad topic!", b"x")
        with pytest.raises(MessageIllegalError, match="tag"):
            producer.send_async(topic, b"ok", tag="t" * 70_000)
        good = [producer.send_async(topic, b"ok"), producer.send_async(topic, bytearray(b"ba")),
                producer.send_async(topic, memoryview(b"mv"))]
        producer.flush()
    assert [f.result().topic for f in good] == [topic] * 3


def test_concurrent_plain_senders_lose_and_repeat_nothing(broker, topic):
    """4 threads append at once through small batches and a small buffer (appends wait for
    room, batches fill every few messages): every message arrives once."""
    threads_n, per_thread = 4, 3000
    with Producer([broker.address], linger_ms=1, batch_bytes=2048, buffer_bytes_max=16 * 1024) as producer:
        futures: list[list[SendFuture]] = [[] for _ in range(threads_n)]

        def send(k: int) -> None:
            for i in range(per_thread):
                futures[k].append(producer.send_async(topic, b"%d-%05d" % (k, i), tag="A" if i % 3 else None))
        _in_threads(send, threads_n)
        producer.flush()
    results = [f.result() for fs in futures for f in fs]
    assert len({(r.queue_id, r.queue_offset) for r in results}) == threads_n * per_thread
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        bodies = sorted(m.body for m in consume(consumer, threads_n * per_thread))
    assert bodies == sorted(b"%d-%05d" % (k, i) for k in range(threads_n) for i in range(per_thread))


def test_concurrent_senders_to_queues_lose_and_repeat_nothing(broker, topic):
    """As the plain senders, with queue=: each message lands once, on the queue it named, in the
    order its thread sent it there."""
    threads_n, per_thread = 4, 2000
    with Producer([broker.address], linger_ms=1, batch_bytes=2048, buffer_bytes_max=16 * 1024) as producer:
        futures: list[list[SendFuture]] = [[] for _ in range(threads_n)]

        def send(k: int) -> None:
            for i in range(per_thread):
                futures[k].append(producer.send_async(topic, b"%d-%05d" % (k, i), queue=i % 2))
        _in_threads(send, threads_n)
        producer.flush()
    for k in range(threads_n):
        results = [f.result() for f in futures[k]]
        assert [r.queue_id for r in results] == [i % 2 for i in range(per_thread)]
        for queue in (0, 1):
            offsets = [r.queue_offset for r in results if r.queue_id == queue]
            assert offsets == sorted(offsets)
    every = [f.result() for fs in futures for f in fs]
    assert len({(r.queue_id, r.queue_offset) for r in every}) == threads_n * per_thread
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        got = consume(consumer, threads_n * per_thread)
    assert sorted(m.body for m in got) == sorted(b"%d-%05d" % (k, i)
                                                 for k in range(threads_n) for i in range(per_thread))
    assert all(int(m.body.split(b"-")[1]) % 2 == m.queue_id for m in got)


def test_futures_are_not_collector_objects_and_callbacks_do_not_leak():
    """A handle is not walked by the cycle collector (nor counted towards its collections); a
    callback referring back to its own handle is a cycle only until the batch is answered."""
    sent: list = []
    with _accumulator(RecordEncoder(), sent, batch_bytes=300) as acc:
        acc.append_plain("t", b"x", None)
        future = acc.append_plain("t", b"x", None)  # made in C
        assert not gc.is_tracked(future) and not gc.is_tracked(SendFuture(concurrent.futures.Future(), 0))
        seen = []
        future.add_done_callback(lambda f, me=future: seen.append((f is me, f.result())))  # refers back
        batch_future = weakref.ref(future._batch.outcome)  # the batch, and with it its outcome
        acc.append_plain("t", b"x" * 200, None)  # fills the batch: sent
        acc._loop.run_until_complete(asyncio.sleep(0.01))
        assert seen == [(True, None)] and repr(future) == "<SendFuture done>"
    del acc, future
    gc.collect()
    assert batch_future() is None


def test_a_callback_that_fills_batches_sends_them_from_the_loop(broker, topic, monkeypatch):
    """A callback runs on the loop's thread: a batch it fills is dispatched there at once (a
    thread that fills a batch otherwise waits for the loop to take it, which the loop itself
    cannot do: with a 5 s wait, ~25 batches would stall it for two minutes)."""
    monkeypatch.setattr(accumulator, "HANDOFF_WAIT_S", 5.0)
    sent: list[SendFuture] = []
    with Producer([broker.address], linger_ms=60_000, batch_bytes=1024) as producer:
        def send_more(_: SendFuture) -> None:
            sent.extend(producer.send_async(topic, b"from-loop-%03d" % i) for i in range(200))
        producer.send_async(topic, b"first", queue=0, callback=send_more)
        producer.flush()  # sends "first"; its callback fills ~25 batches on the loop
        producer.flush()
    assert len(sent) == 200 and all(f.exception() is None for f in sent)
    with Consumer([broker.address], group="g", subscription={topic: "*"}, start_from="first") as consumer:
        assert sorted(m.body for m in consume(consumer, 201))[-1] == b"from-loop-199"
