"""The producer and consumer SDK: synchronous facades over one asyncio core.

    with Producer(brokers=["127.0.0.1:10911"]) as producer:
        producer.send("orders", b"...", tag="created", key="order-42")
    with Consumer(brokers=[...], group="billing", subscription={"orders": "created || paid"}) as c:
        for msg in c: ...
"""

from gms.client.admin import Admin
from gms.client.consumer import Consumer
from gms.client.producer import Producer, ProducerRecord
from gms.client.routing import QueueRoute, RouteProvider, StaticRoutes
from gms.client.structs import ReceivedMessage, SendResult

__all__ = [
    "Admin", "Consumer", "Producer", "ProducerRecord", "QueueRoute", "ReceivedMessage",
    "RouteProvider", "SendResult", "StaticRoutes",
]
