"""The broker's message store: :class:`MessageStore` and the types of its answers. Other modules
import them from here; the package's modules are its parts (docs/architecture.md)."""

from gms.broker.store.api import StoreAPI
from gms.broker.store.message_store import MessageStore
from gms.broker.store.types import (
    AppendResult,
    GetResult,
    GetStatus,
    QueueGet,
    RecordSelector,
    RepairOutcome,
    ReplicaGap,
    ReplicaRead,
    StoreStats,
    TimerListener,
    TimerRecord,
)

__all__ = ["AppendResult", "GetResult", "GetStatus", "MessageStore", "QueueGet", "RecordSelector", "RepairOutcome",
           "ReplicaGap", "ReplicaRead", "StoreAPI", "StoreStats", "TimerListener", "TimerRecord"]
