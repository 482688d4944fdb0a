"""The broker's capabilities as typed services: what every protocol adapter calls.

A protocol adapter (the gms wire handlers ``broker/*_handlers.py``, the RocketMQ gRPC endpoint
``broker/rocketmq/``) decodes a request, makes one service call with typed arguments, and encodes
the typed result or the :mod:`gms.errors` error it raised. The services own the semantics
(validation, long polling, replication waits, access checks, metrics) over the store and the
broker's state (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the services import what the wire adapters' access checks need: no cycle at runtime
    from gms.broker.services.consumption import ConsumptionService
    from gms.broker.services.dead_letters import DeadLetterService
    from gms.broker.services.groups import GroupService
    from gms.broker.services.messages import MessageService
    from gms.broker.services.topics import TopicService
    from gms.broker.services.transactions import TransactionOutcomeService


@dataclass(frozen=True, slots=True)
class Services:
    """The services of a running broker."""

    messages: MessageService
    consumption: ConsumptionService
    groups: GroupService
    transactions: TransactionOutcomeService
    topics: TopicService
    dead_letters: DeadLetterService
