"""The asyncio SDK (gms.client.aio) against a real broker.

The SDK's main scenarios are written once against the asyncio interface and run for both
flavours (``sdk``: the synchronous classes, and gms.client.aio on the test's own loop), so the
two keep one behaviour. Then what only the asyncio classes have: no thread of their own, many
concurrent sends, cancellation, timeouts, coroutine rebalance callbacks, uvloop."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from client_helpers import QUEUES
from sdk_flavours import FLAVOURS, Sdk, consume

from gms.client.aio import AsyncAdmin, AsyncConsumer, AsyncProducer, AsyncSimpleConsumer
from gms.errors import ReceiptHandleExpiredError, RequestTimeoutError, TopicNotFoundError
from gms.naming import dlq_topic, retry_topic

pytestmark = pytest.mark.timeout(120)

try:
    import uvloop
except ImportError:  # pragma: no cover - a dependency where it builds
    uvloop = None


def run(main: Callable[[], Awaitable[Any]], *, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        ) -> Any:
    """Run a scenario on a fresh loop (the default asyncio one unless given); the clients it
    closed leave no task of theirs behind on it."""
    async def scenario() -> Any:
        result = await main()
        await asyncio.sleep(0.1)  # what a closed client would still do
        assert asyncio.all_tasks() == {asyncio.current_task()}, asyncio.all_tasks()
        return result

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(scenario())


@pytest.fixture(params=FLAVOURS)
def sdk(request) -> Sdk:
    return Sdk(request.param)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the SDK's scenarios, in both flavours -----------------------------------------------------------


def test_send_and_receive_with_keys_tags_and_properties(sdk, broker, topic):
    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            sent = [await producer.send(topic, b"one-%d" % i, tag="a" if i % 2 else "b", keys=[f"k{i}"],
                                        properties={"n": str(i)}, key="same") for i in range(6)]
            assert len({r.queue_id for r in sent}) == 1  # one key, one queue, in order
            assert [r.queue_offset for r in sent] == list(range(sent[0].queue_offset, sent[0].queue_offset + 6))
            batch = await producer.send_batch([{"topic": topic, "body": b"batch-%d" % i, "tag": "a"} for i in range(5)])
            assert len(batch) == 5
            queued = [producer.send_nowait(topic, b"later-%d" % i, tag="a") for i in range(20)]
            await producer.flush()
            assert len({(r.queue_id, r.queue_offset) for r in await asyncio.gather(*queued)}) == 20
        async with sdk.consumer([broker.address], group=_name("g"), subscription={topic: "a"},
                                start_from="first") as consumer:
            got = await consume(consumer, 3 + 5 + 20)
        bodies = sorted(bytes(m.body) for m in got)
        assert bodies == sorted([b"one-1", b"one-3", b"one-5", *(b"batch-%d" % i for i in range(5)),
                                 *(b"later-%d" % i for i in range(20))])
        one = next(m for m in got if bytes(m.body) == b"one-3")
        assert (one.tag, list(one.keys), one.properties["n"]) == ("a", ["same", "k3"], "3")  # key= stored first

    run(main)


def test_group_members_share_the_queues_commit_and_rebalance(sdk, broker, topic):
    group = _name("g")
    events: list[tuple[str, str, list[Any]]] = []

    def callbacks(name: str) -> dict[str, Any]:
        def note(kind: str) -> Any:
            if sdk.is_async:  # the asyncio consumer awaits coroutine callbacks
                async def record(queues: list[Any]) -> None:
                    await asyncio.sleep(0)
                    events.append((name, kind, queues))
                return record
            return lambda queues: events.append((name, kind, queues))
        return {"on_assigned": note("assigned"), "on_revoked": note("revoked")}

    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            await producer.send_batch([{"topic": topic, "body": b"%d" % i, "queue": i % QUEUES} for i in range(80)])
        async with sdk.consumer([broker.address], group=group, subscription={topic: "*"}, start_from="first",
                                heartbeat_interval_ms=100, auto_commit=False, **callbacks("first")) as first:
            got = await consume(first, 40)
            assert events[0] == ("first", "assigned", [(topic, q) for q in range(QUEUES)])
            async with sdk.consumer([broker.address], group=group, subscription={topic: "*"}, start_from="first",
                                    heartbeat_interval_ms=100, auto_commit=False, **callbacks("second")) as second:
                deadline = asyncio.get_running_loop().time() + 20
                joined = False
                while len({bytes(m.body) for m in got}) < 80 or not joined:
                    assert asyncio.get_running_loop().time() < deadline, (len(got), events)
                    got += await first.poll(50)
                    got += await second.poll(50)
                    await first.commit()  # what each returned so far
                    await second.commit()
                    joined = any(e[:2] == ("second", "assigned") for e in events)
                revoked = [q for n, kind, qs in events if (n, kind) == ("first", "revoked") for q in qs]
                given = [q for n, kind, qs in events if (n, kind) == ("second", "assigned") for q in qs]
                assert sorted(revoked) == sorted(given) and len(given) == QUEUES // 2
                assert sorted(first.assignment() + second.assignment()) == [(topic, q) for q in range(QUEUES)]
        # At least once: a revoked queue may come again to the other member from its last commit.
        assert {bytes(m.body) for m in got} == {b"%d" % i for i in range(80)}
        async with sdk.admin([broker.address]) as admin:
            described = await admin.group_describe(group)
        assert sum(sum(queues.values()) for queues in described["offsets"][broker.address].values()) == 80
        async with sdk.consumer([broker.address], group=group, subscription={topic: "*"}) as again:
            assert await consume(again, 1, timeout_s=1.5) == []  # everything committed

    run(main)


def test_seek_pause_and_resume(sdk, broker, topic):
    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            await producer.send_batch([{"topic": topic, "body": b"%d" % i, "queue": i % 2} for i in range(10)])
        async with sdk.consumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                start_from="first") as consumer:
            assert len(await consume(consumer, 10)) == 10
            await consumer.seek(topic, 0, 2)
            again = await consume(consumer, 3)
            assert sorted((m.queue_id, m.queue_offset) for m in again) == [(0, 2), (0, 3), (0, 4)]
            assert consumer.position(topic, 0) == 5
            await consumer.seek_to_beginning([(topic, 1)])
            assert len(await consume(consumer, 5)) == 5
            await consumer.pause([(topic, 0)])
            assert consumer.paused() == [(topic, 0)]
            async with sdk.producer([broker.address]) as producer:
                await producer.send_batch([{"topic": topic, "body": b"p%d" % i, "queue": i % 2} for i in range(4)])
            got = await consume(consumer, 4, timeout_s=2)
            assert sorted((m.queue_id, m.queue_offset) for m in got) == [(1, 5), (1, 6)]
            await consumer.resume([(topic, 0)])
            got = await consume(consumer, 2)
            assert sorted((m.queue_id, m.queue_offset) for m in got) == [(0, 5), (0, 6)]
            with pytest.raises(ValueError, match="not assigned"):
                await consumer.seek(topic, QUEUES + 1, 0)

    run(main)


def test_pop_receive_ack_and_invisibility(sdk, broker, topic):
    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            await producer.send_batch([{"topic": topic, "body": b"m%d" % i} for i in range(6)])
        async with sdk.simple_consumer([broker.address], group=_name("pop"), subscription={topic: "*"},
                                       start_from="first", await_duration_ms=300) as consumer:
            first: list[Any] = []
            while len(first) < 6:
                first += await consumer.receive(10, invisible_duration_ms=60_000)
            assert {m.delivery_attempt for m in first} == {1}
            await consumer.ack(first[:4])
            assert list(await consumer.receive(10, await_duration_ms=200)) == []  # the rest is invisible
            await consumer.change_invisible_duration(first[4], 0)  # visible again now
            again = list(await consumer.receive(10, await_duration_ms=3000))
            assert [(m.msg_id, m.delivery_attempt) for m in again] == [(first[4].msg_id, 2)]
            with pytest.raises(ReceiptHandleExpiredError):
                await consumer.ack(first[4])  # the first delivery's handle: handed out again since
            await consumer.ack([str(again[0].receipt_handle), first[5]])

    run(main)


def test_admin_creates_describes_and_deletes_topics(sdk, broker):
    name = _name("adm")

    async def main() -> None:
        async with sdk.admin([broker.address]) as admin:
            await admin.create_topic(name, queues=3)
            assert (await admin.topics())[name] == 3
            assert [s["queue_id"] for s in await admin.topic_stats(name)] == [0, 1, 2]
            results = await admin.create_topics([name, f"{name}-b"])
            assert [r.created for r in results] == [False, True]
            await admin.delete_topic(name)
            assert [r.deleted for r in await admin.delete_topics([f"{name}-b", name])] == [True, False]
            assert name not in await admin.topics()
            with pytest.raises(TopicNotFoundError):
                await admin.topic_stats(name)

    run(main)


def test_transactions_commit_and_roll_back(sdk, broker, topic):
    async def main() -> None:
        async with sdk.producer([broker.address], group=_name("tx")) as producer:
            async with producer.begin_transaction() as tx:
                for i in range(3):
                    await producer.send(topic, b"tx-%d" % i, queue=0, transaction=tx)
            assert tx.state == "committed" and tx.queues == [(topic, 0)]
            rolled = producer.begin_transaction()
            await producer.send(topic, b"never", queue=1, transaction=rolled)
            await rolled.rollback()
            with pytest.raises(RuntimeError):
                async with producer.begin_transaction() as failed:
                    await producer.send(topic, b"never either", queue=1, transaction=failed)
                    raise RuntimeError("the application failed")
            assert failed.state == "rolled_back"
            with pytest.raises(ValueError):
                await rolled.commit()
            await producer.send(topic, b"after", queue=1)
        async with sdk.consumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                start_from="first") as consumer:
            got = await consume(consumer, 4)
            got += await consume(consumer, 1, timeout_s=1)  # nothing more
        assert sorted(bytes(m.body) for m in got) == [b"after", b"tx-0", b"tx-1", b"tx-2"]

    run(main)


def _callback(sdk: Sdk, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` as the flavour takes a callback: a coroutine function for the asyncio classes
    (which await it), as is for the synchronous ones."""
    if not sdk.is_async:
        return function

    async def coroutine(*args: Any) -> Any:
        await asyncio.sleep(0)
        return function(*args)
    return coroutine


async def _trace_events(admin: Any, msg_id: str, count: int, timeout_s: float = 10) -> list[str]:
    """The events of ``msg_id``'s trace, once ``count`` of them are written (or the deadline passed)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        events = [e.event for e in await admin.trace(msg_id)]
        if len(events) >= count or asyncio.get_running_loop().time() > deadline:
            return events
        await asyncio.sleep(0.1)


def test_fifo_listen_holds_a_failed_messages_group_back_until_it_succeeds(sdk, broker, topic):
    order: list[str] = []
    failures = {"a1": 2}  # a1 fails twice, then succeeds

    def handle(message: Any) -> None:
        body = bytes(message.body).decode()
        order.append(body)
        if failures.get(body, 0):
            failures[body] -= 1
            raise RuntimeError("not yet")

    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            for i in range(5):
                for group in ("a", "b"):
                    await producer.send(topic, f"{group}{i}".encode(), message_group=group)
        deadline = asyncio.get_running_loop().time() + 20
        async with sdk.consumer([broker.address], group=_name("fifo"), subscription={topic: "*"},
                                start_from="first", fifo=True) as consumer:
            await consumer.listen(_callback(sdk, handle), stop=lambda: {"a4", "b4"} <= set(order)
                                  or asyncio.get_running_loop().time() > deadline)

    run(main)
    assert [x for x in order if x.startswith("a")] == ["a0", "a1", "a1", "a1", "a2", "a3", "a4"]
    assert [x for x in order if x.startswith("b")] == [f"b{i}" for i in range(5)]


def test_nack_retries_then_dead_letters_and_the_traces_show_it(sdk, broker, topic):
    group = _name("g")

    async def main() -> None:
        async with sdk.producer([broker.address], trace=True) as producer:
            sent = await producer.send(topic, b"poison", queue=0)
        went: list[str] = []
        async with sdk.consumer([broker.address], group=group, subscription={topic: "*"}, start_from="first",
                                max_reconsume_times=1, retry_delays_ms=(100,), trace=True) as consumer:
            deadline = asyncio.get_running_loop().time() + 15
            while len(went) < 2 and asyncio.get_running_loop().time() < deadline:
                for message in await consumer.poll(100):
                    assert not consumer.held(message)  # (not FIFO: nothing is held back)
                    went.append(await consumer.nack(message, reason="cannot parse"))
        assert went == [retry_topic(group), dlq_topic(group)]
        async with sdk.admin([broker.address]) as admin:
            assert await _trace_events(admin, sent.msg_id, 6) == [
                "send", "store", "deliver", "retry", "deliver", "dead-letter"]

    run(main)


def test_pop_nack_ack_without_waiting_and_traces(sdk, broker, topic):
    async def main() -> None:
        async with sdk.producer([broker.address], trace=True) as producer:
            retried, acked = await producer.send_batch([{"topic": topic, "body": b"a", "queue": 0},
                                                        {"topic": topic, "body": b"b", "queue": 0}])
        async with sdk.simple_consumer([broker.address], group=_name("pop"), subscription={topic: "*"},
                                       start_from="first", invisible_duration_ms=60_000, trace=True) as consumer:
            first: dict[bytes, Any] = {}
            while len(first) < 2:
                first |= {bytes(m.body): m for m in await consumer.receive(10, await_duration_ms=3000)}
            await consumer.nack(first[b"a"], delay_ms=100)
            await consumer.ack_nowait(first[b"b"])
            (again,) = await consumer.receive(10, await_duration_ms=3000)
            assert (bytes(again.body), again.delivery_attempt) == (b"a", 2)
            with pytest.raises(TypeError):
                consumer.ack_nowait([object()])  # bad input raises at once
            pending = consumer.ack_nowait(again)  # on its way as the consumer closes: close waits for it
        await pending
        async with sdk.admin([broker.address]) as admin:
            assert await _trace_events(admin, acked.msg_id, 4) == ["send", "store", "deliver", "ack"]
            assert await _trace_events(admin, retried.msg_id, 6) == [
                "send", "store", "deliver", "retry", "deliver", "ack"]

    run(main)


def test_send_oneway_and_callbacks_of_queued_sends(sdk, broker, topic):
    called: list[Any] = []

    async def main() -> None:
        async with sdk.producer([broker.address]) as producer:
            await producer.send_oneway(topic, b"oneway", queue=1)
            future = producer.send_nowait(topic, b"called back", key="k", callback=_callback(sdk, called.append))
            await producer.flush()
            result = await future
            deadline = asyncio.get_running_loop().time() + 5
            while not called and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert called == [future] and called[0].result() == result
        async with sdk.consumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                start_from="first") as consumer:
            got = await consume(consumer, 2)
        assert sorted(bytes(m.body) for m in got) == [b"called back", b"oneway"]

    run(main)


# --- what only the asyncio classes have -------------------------------------------------------------


def _sockets() -> int:
    """This process's open sockets."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def test_they_run_on_the_callers_loop_without_a_thread_and_refuse_outside_one(broker, topic):
    with pytest.raises(RuntimeError, match="inside a coroutine"):
        AsyncProducer([broker.address])

    async def main() -> None:
        threads = threading.active_count()
        async with AsyncProducer([broker.address]) as producer, AsyncConsumer(
                [broker.address], group=_name("g"), subscription={topic: "*"}, start_from="first") as consumer:
            await producer.send(topic, b"x")
            async for message in consumer:
                assert bytes(message.body) == b"x"
                break
            assert threading.active_count() == threads

    run(main)


def test_send_nowait_never_blocks_and_drain_waits_for_room(broker, topic):
    async def main() -> None:
        async with AsyncProducer([broker.address], buffer_bytes_max=64 * 1024, linger_ms=200) as producer:
            first = producer.send_nowait(topic, b"first")  # the topic's routes are looked up first
            assert not first.done()
            called: list[Any] = []
            first.add_done_callback(called.append)
            assert (await first).topic == topic and called == [first] and first.exception() is None
            assert first.result().queue_offset == (await first).queue_offset  # done: result() does not wait
            pending = [producer.send_nowait(topic, b"%d" % i + b"x" * 100) for i in range(2000)]
            assert producer._accumulator.full  # past buffer_bytes_max, and still it did not block
            await producer.drain()  # until the lingered batches are answered
            assert not producer._accumulator.full
            results = await asyncio.gather(*pending)
        assert len({(r.queue_id, r.queue_offset) for r in results}) == 2000
        with pytest.raises(RuntimeError, match="closed"):
            producer.send_nowait(topic, b"too late")

    run(main)


def test_a_thousand_concurrent_sends_each_stored_once(broker, topic):
    async def main() -> None:
        async with AsyncProducer([broker.address]) as producer:
            results = await asyncio.gather(*(producer.send(topic, b"%d" % i) for i in range(1000)))
        assert len({(r.queue_id, r.queue_offset) for r in results}) == 1000
        async with AsyncConsumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                 start_from="first", max_poll_messages=4096) as consumer:
            got = await consume(consumer, 1000)
            got += await consume(consumer, 1, timeout_s=0.5)
        assert sorted(int(bytes(m.body)) for m in got) == list(range(1000))

    run(main)


def test_cancelled_sends_leave_no_half_request_or_leaked_connection(broker, topic):
    async def main() -> None:
        before = _sockets()
        async with AsyncProducer([broker.address]) as producer:
            connecting = asyncio.ensure_future(producer.send(topic, b"cancelled while connecting"))
            await asyncio.sleep(0)
            connecting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await connecting
            tasks = [asyncio.ensure_future(producer.send(topic, b"c%d" % i)) for i in range(200)]
            await asyncio.sleep(0.001)
            for task in tasks[::2]:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            # The connection carries on: the next sends are answered, on the one connection.
            after = await asyncio.gather(*(producer.send(topic, b"after-%d" % i) for i in range(10)))
            assert len(after) == 10 and len(producer._runtime.pool._connections) == 1
        assert _sockets() == before  # closed with the producer, none left behind
        sent = {bytes(m) for m, o in zip([b"c%d" % i for i in range(200)], outcomes, strict=True)
                if not isinstance(o, BaseException)}
        async with AsyncConsumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                 start_from="first", max_poll_messages=4096) as consumer:
            got = await consume(consumer, 211, timeout_s=3)
        bodies = [bytes(m.body) for m in got]
        assert len(bodies) == len(set(bodies))  # a cancelled send may be stored, never twice
        assert sent <= set(bodies) and {b"after-%d" % i for i in range(10)} <= set(bodies)

    run(main)


def test_timeouts_bound_a_call_on_a_stopped_broker_and_the_client_recovers(broker, topic):
    async def main() -> None:
        async with AsyncProducer([broker.address], request_timeout_ms=300, retries=0) as producer, AsyncConsumer(
                [broker.address], group=_name("g"), subscription={topic: "*"}, start_from="first") as consumer:
            await producer.send(topic, b"before")
            assert len(await consume(consumer, 1)) == 1
            with pytest.raises(TimeoutError):  # the caller's own deadline: poll gives up waiting
                await asyncio.wait_for(consumer.poll(10_000), 0.2)
            broker.pause()
            try:
                with pytest.raises(RequestTimeoutError):
                    await producer.send(topic, b"unanswered")
                stuck = asyncio.ensure_future(producer.send(topic, b"cancelled"))
                await asyncio.sleep(0.05)
                stuck.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await stuck
            finally:
                broker.resume()
            await producer.send(topic, b"after")
            got = await consume(consumer, 1, timeout_s=15)
            while not any(bytes(m.body) == b"after" for m in got):
                more = await consume(consumer, 1, timeout_s=15)
                assert more, [bytes(m.body) for m in got]
                got += more

    run(main)


def test_pop_consumer_forwards_exhausted_messages_to_the_dead_letters(broker, topic):
    group = _name("pop")

    async def main() -> None:
        async with AsyncProducer([broker.address]) as producer:
            await producer.send(topic, b"poison")
        async with AsyncSimpleConsumer([broker.address], group=group, subscription={topic: "*"},
                                       start_from="first", await_duration_ms=300, max_delivery_attempts=1) as consumer:
            (message,) = await consumer.receive(1, invisible_duration_ms=60_000)
            assert await consumer.forward_to_dead_letters(message, "bad") == dlq_topic(group)
            assert list(await consumer.receive(1, await_duration_ms=200)) == []
        async with AsyncAdmin([broker.address]) as admin:
            assert dlq_topic(group) in await admin.topics()

    run(main)


@pytest.mark.skipif(uvloop is None, reason="uvloop is not installed")
def test_on_uvloop(broker, topic):
    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with AsyncProducer([broker.address]) as producer:
            results = await asyncio.gather(*(producer.send(topic, b"%d" % i) for i in range(100)))
            queued = [producer.send_nowait(topic, b"n%d" % i) for i in range(100)]
            await producer.flush()
            assert len(await asyncio.gather(*queued)) == 100 and len(results) == 100
        async with AsyncConsumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                 start_from="first") as consumer:
            assert len(await consume(consumer, 200)) == 200

    run(main, loop_factory=uvloop.new_event_loop)


def test_a_poll_cancelled_in_a_rebalance_callback_leaves_the_assignment_to_the_next(broker, topic):
    calls: list[list[Any]] = []
    release = asyncio.Event()

    async def on_assigned(queues: list[Any]) -> None:
        calls.append(queues)
        if len(calls) == 1:
            await release.wait()  # the first call hangs until its poll is cancelled

    async def main() -> None:
        async with AsyncProducer([broker.address]) as producer:
            await producer.send(topic, b"x")
        async with AsyncConsumer([broker.address], group=_name("g"), subscription={topic: "*"},
                                 start_from="first", on_assigned=on_assigned) as consumer:
            while True:
                try:
                    await asyncio.wait_for(consumer.poll(100), 1)
                except TimeoutError:
                    break  # cancelled inside the callback, which hangs
            assert len(calls) == 1
            got = await consume(consumer, 1)
            assert [bytes(m.body) for m in got] == [b"x"]
            assert calls == [[(topic, q) for q in range(QUEUES)]] * 2  # run again by the next poll

    run(main)
