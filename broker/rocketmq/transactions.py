"""The check-back of RocketMQ 5 producers' transactions, through their Telemetry streams.

RocketMQ has no pull for check-backs: the server pushes a RecoverOrphanedTransactionCommand down a
producer's Telemetry stream, the client runs its TransactionChecker and answers with EndTransaction
(source SERVER_CHECK). gms's producers instead long-poll CHECK_TRANSACTIONS per producer group
(docs/transactions.md); :class:`CheckBacks` bridges the two with the transaction service: for
as long as a producer's stream lasts, it long-polls for the producer groups of the topics the
producer publishes (:func:`~gms.broker.rocketmq.mapping.producer_group`) and pushes each due
transaction's half message down the stream. So the broker's check timing, its one-producer-per-
check hand-out and its rollback when checks run out are gms's, unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rocketmq.grpc_protocol import service_pb2

from gms.address import split_address
from gms.broker.rocketmq.mapping import Receipt, producer_group, status, to_rocketmq
from gms.errors import GmsError
from gms.msgid import encode_msg_id
from gms.record import decode_record

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

CHECK_POLL_MS = 5_000  # one long poll (the broker caps it at its long_poll_max_ms)
CHECK_RETRY_S = 1.0  # after a failed poll


class CheckBacks:
    """The check-backs of one Telemetry stream: ``push`` gets each command to send down it."""

    def __init__(self, broker: BrokerServer, push: Callable[[Any], None]) -> None:
        self._broker = broker
        self._push = push
        self._topics: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None

    def follow(self, settings: Any) -> None:
        """Poll for the topics a producer's settings publish (again from the start when they
        change); nothing for a consumer's."""
        topics = frozenset(topic.name for topic in settings.publishing.topics) if settings.HasField("publishing") \
            else frozenset()
        if topics == self._topics:
            return
        self.stop()
        self._topics = topics
        if topics:
            self._task = asyncio.get_running_loop().create_task(self._run(topics))

    def stop(self) -> None:
        """The stream ended: no more polls (a transaction taken but not pushed is due again at its
        next check)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, topics: frozenset[str]) -> None:
        async with asyncio.TaskGroup() as polls:
            for topic in sorted(topics):
                polls.create_task(self._poll(producer_group(topic)))

    async def _poll(self, group: str) -> None:
        service = self._broker.services.transactions
        while True:
            try:
                due = await service.due_checks(group, CHECK_POLL_MS)
            except GmsError as err:
                log.warning("transaction check-back of %r: %s", group, err)
                await asyncio.sleep(CHECK_RETRY_S)
                continue
            if not due and service.state.stopped:
                return  # the broker is stopping
            for check in due:  # the halves are views into the log: converted before the next await
                if check.halves:  # a RocketMQ client's transaction has one message
                    self._push(self._command(check.tx_id, check.halves[0]))

    def _command(self, tx_id: str, half: memoryview) -> Any:
        """The check-back of a transaction: its half message as a message the client reads, but
        no delivery (no receipt handle, no attempt)."""
        record = decode_record(half, verify_crc=False)
        address = self._broker.address
        host, port = split_address(address, "broker address")
        message = to_rocketmq(record, 1, Receipt(record.topic, record.queue_id, record.queue_offset, 1, address),
                              encode_msg_id(host, port, record.phys_offset))
        message.system_properties.ClearField("receipt_handle")
        message.system_properties.ClearField("delivery_attempt")
        command = service_pb2.RecoverOrphanedTransactionCommand(message=message, transaction_id=tx_id)
        return service_pb2.TelemetryCommand(status=status(), recover_orphaned_transaction_command=command)
