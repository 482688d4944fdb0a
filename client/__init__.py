"""The producer and consumer SDK: synchronous facades over one asyncio core.

Routes come from nameservers (``nameserver="host:9876,host2:9876"``) or a fixed broker list:

    with Producer(nameserver="127.0.0.1:9876") as producer:
        producer.send("orders", b"...", tag="created", key="order-42")
    with Consumer(brokers=[...], group="billing", subscription={"orders": "created || paid"}) as c:
        for msg in c: ...
"""

from gms.client.admin import Admin, TopicResult, TopicSpec
from gms.client.consumer import Consumer, Sql
from gms.client.fetcher import TopicQueue
from gms.client.producer import Producer, ProducerRecord
from gms.client.routing import NameserverRoutes, QueueRoute, RouteProvider, StaticRoutes
from gms.client.send_results import SendFuture, SendResult, SendResults
from gms.client.simple_consumer import SimpleConsumer
from gms.client.structs import (
    DamagedRecord,
    DamagedRecordError,
    PoppedMessage,
    ReceiptHandle,
    ReceivedMessage,
    ReceivedMessages,
)
from gms.client.transactions import Transaction, TransactionState

__all__ = [
    "Admin",
    "Consumer",
    "DamagedRecord",
    "DamagedRecordError",
    "NameserverRoutes",
    "PoppedMessage",
    "Producer",
    "ProducerRecord",
    "QueueRoute",
    "ReceiptHandle",
    "ReceivedMessage",
    "ReceivedMessages",
    "RouteProvider",
    "SendFuture",
    "SendResult",
    "SendResults",
    "SimpleConsumer",
    "Sql",
    "StaticRoutes",
    "TopicQueue",
    "TopicResult",
    "TopicSpec",
    "Transaction",
    "TransactionState",
]
