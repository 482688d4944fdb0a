import asyncio

from gms.broker.long_poll import PullWaiters


def test_notify_wakes_only_the_touched_queue():
    async def scenario():
        waiters = PullWaiters()
        a = asyncio.create_task(waiters.wait(("t", 0), 5))
        b = asyncio.create_task(waiters.wait(("t", 1), 0.2))
        await asyncio.sleep(0.01)
        assert len(waiters) == 2
        waiters.notify([("t", 0)])
        assert await a is True
        assert await b is False
        assert len(waiters) == 0

    asyncio.run(scenario())


def test_close_releases_everything_and_refuses_new_waits():
    async def scenario():
        waiters = PullWaiters()
        tasks = [asyncio.create_task(waiters.wait(("t", q), 5)) for q in range(3)]
        await asyncio.sleep(0.01)
        waiters.close()
        assert await asyncio.gather(*tasks) == [True, True, True]
        assert await waiters.wait(("t", 0), 5) is False

    asyncio.run(scenario())
