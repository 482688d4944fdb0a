"""The broker's message store (see message_store.py); other modules import it from here."""

from gms.broker.store.message_store import (
    AppendResult,
    GetResult,
    GetStatus,
    MessageStore,
    RecordSelector,
    RepairOutcome,
    ReplicaGap,
    ReplicaRead,
    StoreStats,
    TimerListener,
    TimerRecord,
)

__all__ = ["AppendResult", "GetResult", "GetStatus", "MessageStore", "RecordSelector", "RepairOutcome",
           "ReplicaGap", "ReplicaRead", "StoreStats", "TimerListener", "TimerRecord"]
