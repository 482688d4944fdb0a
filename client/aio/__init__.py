"""The asyncio SDK: the producer, consumers and admin to ``await`` from ``async def`` code.

They run the synchronous SDK's one core (the same options, errors and delivery guarantees) on
the caller's running event loop — uvloop's too — with no thread of their own; see docs/asyncio.md.

    async with AsyncProducer(nameserver="127.0.0.1:9876") as producer:
        await producer.send("orders", b"...", key="order-42")
    async with AsyncConsumer(nameserver=..., group="billing", subscription={"orders": "*"}) as consumer:
        async for message in consumer: ...
"""

from gms.client.admin import AsyncAdmin
from gms.client.aio.consumer import AsyncConsumer, AsyncListener, AsyncRebalanceCallback
from gms.client.aio.producer import AsyncProducer, AsyncTransaction
from gms.client.aio.simple_consumer import AsyncSimpleConsumer

__all__ = [
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncListener",
    "AsyncProducer",
    "AsyncRebalanceCallback",
    "AsyncSimpleConsumer",
    "AsyncTransaction",
]
