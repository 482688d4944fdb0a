"""The RocketMQ 5 gRPC messaging service (``apache.rocketmq.v2.MessagingService``) on a broker.

Every RPC answers through the broker's services (:mod:`gms.broker.services`), as gms's own
protocol does, so it has gms's semantics and no second implementation of them: SendMessage stores
a record as SEND does, ReceiveMessage pops as POP_MESSAGE does (long polling, tag and SQL92
filters, invisibility, attempts), AckMessage and ChangeInvisibleDuration are the consumption
service's. Receives pop with the group's max delivery attempts and FIFO flag (``gms group
config``); a message out of attempts goes to the group's dead-letter topic as gms's SimpleConsumer
moves it, and so does one a client forwards (ForwardMessageToDeadLetterQueue), through the
dead-letter service (:mod:`gms.broker.services.dead_letters`), which reads the group settings too.
A TRANSACTION message is a half message of gms's transactions, EndTransaction is END_TRANSACTION,
and a producer's Telemetry stream carries the check-backs of its transactions
(:mod:`gms.broker.rocketmq.transactions`). The endpoint runs on the broker's event loop
(``grpc.aio``). The pull consumer's offset RPCs are :mod:`gms.broker.rocketmq.offsets`. RPCs this
slice does not serve answer ``NOT_IMPLEMENTED`` at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import xxhash
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from gms.address import join_address, split_address
from gms.broker.rocketmq.mapping import (
    MESSAGE_ID_PROPERTY,
    RecallHandle,
    Receipt,
    accepted_types,
    check_message_type,
    duration_ms,
    error_status,
    filter_args,
    from_rocketmq,
    status,
    to_rocketmq,
)
from gms.broker.rocketmq.offsets import Offsets
from gms.broker.rocketmq.renewals import INVISIBLE_MS, Renewals
from gms.broker.rocketmq.routes import served_queues
from gms.broker.rocketmq.transactions import CheckBacks
from gms.broker.services.consumption import PopArgs
from gms.broker.services.groups import check_group_name
from gms.errors import BadRequestError, GmsError, ReceiptHandleExpiredError
from gms.msgid import encode_msg_id
from gms.naming import EXHAUSTED_REASON
from gms.record import decode_record, encode_record, iter_records
from gms.record.layout import FLAG_SCHEDULED

if TYPE_CHECKING:
    from gms.broker.server import BrokerServer

log = logging.getLogger(__name__)

Code = definition_pb2.Code
# What a client waits for a receive is its long polling timeout plus its request timeout (3 s by
# default): answer this much before the long polling timeout runs out.
POLL_MARGIN_MS = 500
# RocketMQ's proxy clamps long polling to 20 s (grpcClientConsumerMaxLongPollingTimeoutMillis); the
# broker's long_poll_max_ms caps each poll further.
LONG_POLLING_MAX_MS = 20_000
BATCH_SIZE_MAX = 1024  # messages in one ReceiveMessage (RocketMQ's proxy allows 32 by default)
# Acknowledged once every in-sync replica has it (as a RocketMQ broker in SYNC_MASTER or controller
# mode): a RocketMQ client has no acks setting, and a leader's failover must not lose what it acked.
SEND_ACKS = -1
# Retries the producer's settings tell it to make (RocketMQ's defaults: 3 attempts, 10 ms × 2ⁿ to 1 s).
SEND_ATTEMPTS = 3
BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, BACKOFF_MULTIPLIER = 10, 1000, 2.0
# A request for a topic created a moment ago waits for it (TopicService.arrival) until this much
# before the client's deadline, and never longer than the broker's send timeout.
DEADLINE_MARGIN_S = 0.5


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """The servicer; ``endpoint`` is the host:port clients are told to use for it."""

    def __init__(self, broker: BrokerServer, endpoint: str) -> None:
        self.broker = broker
        self.endpoint = endpoint
        self.dead_letters = broker.services.dead_letters
        self.offsets = Offsets(broker)
        self.renewals = Renewals(self._change_invisible)
        self._turns = itertools.count()

    # -- routes, heartbeats, settings --------------------------------------------------------------

    async def QueryRoute(self, request: Any, context: Any) -> Any:  # gRPC names the methods
        topics = self.broker.services.topics
        await topics.arrival(request.topic.name, self._arrival_wait_s(context), led_here=False)
        try:
            served = served_queues(topics, request.topic.name, self.broker.name, self.endpoint)
        except GmsError as err:
            return service_pb2.QueryRouteResponse(status=error_status(err))
        response = service_pb2.QueryRouteResponse(status=status())
        accepted = accepted_types(topics.message_type(request.topic.name))
        for queue in served:
            route = response.message_queues.add()
            route.topic.CopyFrom(request.topic)
            route.id = queue.queue_id
            route.permission = definition_pb2.Permission.READ_WRITE
            route.broker.CopyFrom(_broker(queue.broker, queue.endpoint))
            route.accept_message_types.extend(accepted)
        return response

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        self.renewals.seen(_client_id(context))
        return service_pb2.HeartbeatResponse(status=status())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        """The client's messages are no longer renewed: what it did not acknowledge comes back
        once its invisible duration ends."""
        self.renewals.client_gone(_client_id(context))
        return service_pb2.NotifyClientTerminationResponse(status=status())

    async def QueryAssignment(self, request: Any, context: Any) -> Any:
        """One assignment per broker that leads queues of the topic: a receive there pops from
        every queue that broker leads."""
        try:
            check_group_name(request.group.name)
        except GmsError as err:
            return service_pb2.QueryAssignmentResponse(status=error_status(err))
        route = await self.QueryRoute(service_pb2.QueryRouteRequest(topic=request.topic), context)
        response = service_pb2.QueryAssignmentResponse(status=route.status)
        brokers = {queue.broker.name: queue for queue in route.message_queues}
        for name in sorted(brokers):
            queue = response.assignments.add().message_queue
            queue.CopyFrom(brokers[name])
            queue.id = -1
        return response

    async def Telemetry(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Answer each settings command (:meth:`_settings`); down a producer's stream also push the
        check-backs of its transactions until the stream ends. Other commands (thread stacks,
        verify results: answers to requests gms never makes) are answered NOT_IMPLEMENTED."""
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        checks = CheckBacks(self.broker, outbox.put_nowait)

        async def answer() -> None:
            try:
                async for command in request_iterator:
                    if command.HasField("settings"):
                        checks.follow(command.settings)
                        outbox.put_nowait(await self._settings(command.settings))
                    else:
                        outbox.put_nowait(service_pb2.TelemetryCommand(status=status(
                            Code.NOT_IMPLEMENTED, f"gms does not take {command.WhichOneof('command')} commands")))
            finally:
                outbox.put_nowait(None)  # the client closed its side: so does the answer

        reader = asyncio.get_running_loop().create_task(answer())
        try:
            while (command := await outbox.get()) is not None:
                yield command
            await reader  # its error, if any, ends the stream
        finally:
            reader.cancel()
            checks.stop()

    async def _settings(self, requested: Any) -> Any:
        """Those settings and the retry policy a producer needs, or for a consumer its group's max
        delivery attempts, retry delays and FIFO flag."""
        settings = definition_pb2.Settings()
        settings.CopyFrom(requested)
        policy = settings.backoff_policy
        if settings.HasField("subscription"):
            try:
                group = await self.dead_letters.settings(settings.subscription.group.name)
            except GmsError as err:
                return service_pb2.TelemetryCommand(status=error_status(err))
            # A push consumer waits the group's retry delays between a failure and the redelivery.
            policy.max_attempts = group.max_delivery_attempts
            for delay_ms in group.retry_delays_ms:
                policy.customized_backoff.next.add().FromMilliseconds(delay_ms)
            settings.subscription.fifo = group.fifo
        else:
            policy.max_attempts = SEND_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(BACKOFF_INITIAL_MS)
            policy.exponential_backoff.max.FromMilliseconds(BACKOFF_MAX_MS)
            policy.exponential_backoff.multiplier = BACKOFF_MULTIPLIER
        return service_pb2.TelemetryCommand(status=status(), settings=settings)

    # -- send ---------------------------------------------------------------------------------------

    async def SendMessage(self, request: Any, context: Any) -> Any:
        response = service_pb2.SendMessageResponse(status=status())
        if len(request.messages) != 1:  # the clients send one at a time
            response.status.CopyFrom(status(Code.BAD_REQUEST, "send one message per SendMessage"))
            return response
        try:
            entry = await self._send(request.messages[0], self._arrival_wait_s(context))
        except GmsError as err:
            response.status.CopyFrom(error_status(err))
            entry = service_pb2.SendResultEntry(status=response.status)
        else:
            system = request.messages[0].system_properties
            if system.message_type == definition_pb2.MessageType.TRANSACTION:  # a half message (mapping.from_rocketmq)
                entry.transaction_id = system.message_id
        response.entries.append(entry)
        return response

    async def EndTransaction(self, request: Any, context: Any) -> Any:
        """END_TRANSACTION of the transaction a TRANSACTION message opened, from the application
        (source CLIENT) or its checker answering a check-back (SERVER_CHECK) alike. No resolution
        (a checker's "unknown"), as RocketMQ's proxy: OK and nothing done, asked again at the next check."""
        resolution = definition_pb2.TransactionResolution
        if request.resolution not in (resolution.COMMIT, resolution.ROLLBACK):
            return service_pb2.EndTransactionResponse(status=status())
        commit = request.resolution == resolution.COMMIT
        try:
            await self.broker.services.transactions.ended(request.transaction_id, commit, SEND_ACKS)
        except GmsError as err:
            return service_pb2.EndTransactionResponse(status=error_status(err))
        return service_pb2.EndTransactionResponse(status=status())

    def _arrival_wait_s(self, context: Any) -> float:
        """How long a request may wait for its topic to arrive (DEADLINE_MARGIN_S)."""
        wait_s = self.broker.config.send_timeout_ms / 1000
        remaining = context.time_remaining()  # None: the client set no deadline
        return wait_s if remaining is None else max(min(wait_s, remaining - DEADLINE_MARGIN_S), 0.0)

    async def _send(self, message: Any, arrival_wait_s: float) -> Any:
        """Store ``message``; a topic created a moment ago is waited for up to ``arrival_wait_s``."""
        topics = self.broker.services.topics
        await topics.arrival(message.topic.name, arrival_wait_s, led_here=True)
        now_ms = int(time.time() * 1000)
        queue_ids = topics.queues_led(message.topic.name)  # TopicNotFoundError first
        if not queue_ids:
            raise BadRequestError(f"this broker leads no queue of {message.topic.name!r}: refresh the route")
        outgoing = from_rocketmq(message, now_ms, topics.message_size_max(message.topic.name))
        check_message_type(message, topics.message_type(outgoing.topic))
        if outgoing.message_group is not None:  # as gms's producer routes a key: same group, same queue
            queue_id = queue_ids[xxhash.xxh64_intdigest(outgoing.message_group.encode()) % len(queue_ids)]
        else:
            queue_id = queue_ids[next(self._turns) % len(queue_ids)]
        record = encode_record(topic=outgoing.topic, body=outgoing.body, tag=outgoing.tag, keys=outgoing.keys,
                               properties=outgoing.properties, queue_id=queue_id, flags=outgoing.flags,
                               born_host=outgoing.born_host, born_ts_ms=outgoing.born_ts_ms)
        stored = await self.broker.services.messages.stored(record, SEND_ACKS)
        entry = service_pb2.SendResultEntry(status=status(), message_id=outgoing.message_id,
                                            offset=int(stored.queue_offsets[0]))
        if outgoing.flags & FLAG_SCHEDULED:  # RecallMessage cancels it until its time
            phys_offset = int(stored.phys_offsets[0])
            entry.recall_handle = RecallHandle(outgoing.topic, self.broker.address, phys_offset,
                                               outgoing.message_id).encode()
        return entry

    async def RecallMessage(self, request: Any, context: Any) -> Any:
        """Cancel a DELAY message before its time: gms's CANCEL_SCHEDULED of the record the handle names."""
        try:
            handle = RecallHandle.decode(request.recall_handle)
            if handle.topic != request.topic.name:
                raise BadRequestError(f"the recall handle is of topic {handle.topic!r}, not {request.topic.name!r}")
            if handle.broker != self.broker.address:
                raise BadRequestError(f"the message was stored by broker {handle.broker}, not this one")
            self.broker.services.messages.cancel_scheduled(handle.phys_offset)
        except GmsError as err:
            return service_pb2.RecallMessageResponse(status=error_status(err))
        return service_pb2.RecallMessageResponse(status=status(), message_id=handle.message_id)

    # -- receive, ack, invisibility ------------------------------------------------------------------

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            messages = await self._receive(request, _client_id(context), self._arrival_wait_s(context))
        except GmsError as err:
            yield service_pb2.ReceiveMessageResponse(status=error_status(err))
            return
        if not messages:
            yield service_pb2.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield service_pb2.ReceiveMessageResponse(status=status())
        delivered = service_pb2.ReceiveMessageResponse()  # when the messages left (clients measure latency)
        delivered.delivery_timestamp.GetCurrentTime()
        yield delivered
        for message in messages:
            yield service_pb2.ReceiveMessageResponse(message=message)

    async def _receive(self, request: Any, client_id: str, arrival_wait_s: float) -> list[Any]:
        """Pop until messages come or the long polling ends; the ones out of attempts go to the
        dead letters meanwhile. ``auto_renew`` (push consumers): invisible for the renewals'
        duration, renewed while the client holds them. A topic created a moment ago is waited
        for up to ``arrival_wait_s`` first, within the long polling: an empty answer comes when
        the client expects it, not near its deadline."""
        deadline = time.monotonic() + _long_polling_ms(request) / 1000
        topics, topic = self.broker.services.topics, request.message_queue.topic.name
        await topics.arrival(topic, min(arrival_wait_s, deadline - time.monotonic()), led_here=True)
        if topics.arriving_here(topic):  # still being applied here (a slow host): no message yet, not an error
            return []
        invisible_ms = INVISIBLE_MS if request.auto_renew else duration_ms(request.invisible_duration)
        while True:
            popped = await self._pop(request, invisible_ms, max(int((deadline - time.monotonic()) * 1000), 0))
            if popped is not None:
                messages, receipts = popped
                if request.auto_renew:
                    self.renewals.hold(client_id, request.group.name, receipts)
                return messages

    async def _pop(self, request: Any, invisible_ms: int,
                   long_polling_ms: int) -> tuple[list[Any], list[Receipt]] | None:
        """One pop: its messages and their receipts, or None if it only moved messages to the dead
        letters and time is left."""
        group, topic = request.group.name, request.message_queue.topic.name
        settings = await self.dead_letters.settings(group)
        tags, sql = filter_args(request.filter_expression)
        popped = await self.broker.services.consumption.pop(PopArgs(
            group, topic, invisible_ms, max_msgs=min(max(request.batch_size, 1), BATCH_SIZE_MAX),
            poll_ms=max(long_polling_ms - POLL_MARGIN_MS, 0), max_attempts=settings.max_delivery_attempts,
            fifo=settings.fifo, start="whole", tags=tags, sql=sql))  # "whole": RocketMQ's rule for a new group
        dead = [(bytes(view), attempt) for view, attempt in zip(popped.exhausted, popped.exhausted_attempts,
                                                                 strict=True)]
        views, attempts = popped.again + popped.fresh, popped.again_attempts
        for raw, attempt in dead:  # copied: the views may not outlive the awaits
            await self._dead_letter(group, topic, raw, attempt, EXHAUSTED_REASON)
        if dead and not views and long_polling_ms > POLL_MARGIN_MS:
            return None
        host, port = split_address(self.broker.address, "broker address")
        messages, receipts = [], []
        for i, view in enumerate(views):  # again-delivered records first, one per view
            records = [decode_record(view, verify_crc=False)] if i < len(attempts) else iter_records(view, False)
            for record in records:
                attempt = attempts[i] if i < len(attempts) else 1
                receipt = Receipt(topic, record.queue_id, record.queue_offset, attempt, self.broker.address)
                messages.append(to_rocketmq(record, attempt, receipt, encode_msg_id(host, port, record.phys_offset)))
                receipts.append(receipt)
        return messages, receipts

    async def _dead_letter(self, group: str, topic: str, record: bytes, attempt: int, reason: str) -> None:
        """Move a popped record to the group's dead-letter topic: stored there, then acknowledged here."""
        header = decode_record(memoryview(record), verify_crc=False)
        # RocketMQ keeps a dead letter's message id: so do we
        dlq = await self.dead_letters.dead_letter(group, record, attempt, reason, keep=(MESSAGE_ID_PROPERTY,))
        if await self._ack(group, topic, [Receipt(topic, header.queue_id, header.queue_offset, attempt, "")]):
            log.info("%s/%d@%d went to %s but was handed out again meanwhile", topic, header.queue_id,
                     header.queue_offset, dlq)

    async def _ack(self, group: str, topic: str, receipts: list[Receipt]) -> set[tuple[int, int]]:
        """Acknowledge deliveries; the (queue id, offset) of those no longer in flight."""
        return set(self.broker.services.consumption.ack(
            group, topic, np.array([r.queue_id for r in receipts], np.int32),
            np.array([r.offset for r in receipts], np.int64), np.array([r.attempt for r in receipts], np.int32)))

    async def AckMessage(self, request: Any, context: Any) -> Any:
        response = service_pb2.AckMessageResponse(status=status())
        try:
            receipts = [_receipt(entry.receipt_handle, request.topic.name) for entry in request.entries]
            self.renewals.release(request.group.name, receipts)
            expired = await self._ack(request.group.name, request.topic.name, receipts)
        except GmsError as err:
            response.status.CopyFrom(error_status(err))
            return response
        for entry, receipt in zip(request.entries, receipts, strict=True):
            gone = (receipt.queue_id, receipt.offset) in expired
            response.entries.add(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                 status=status(Code.INVALID_RECEIPT_HANDLE, "delivery no longer in flight") if gone
                                 else status())
        if expired:
            response.status.CopyFrom(status(Code.MULTIPLE_RESULTS if len(expired) < len(receipts)
                                            else Code.INVALID_RECEIPT_HANDLE, f"{len(expired)} handle(s) expired"))
        return response

    async def ChangeInvisibleDuration(self, request: Any, context: Any) -> Any:
        try:
            receipt = _receipt(request.receipt_handle, request.topic.name)
            self.renewals.release(request.group.name, [receipt])  # the client chose: no more renewals
            await self._change_invisible(request.group.name, receipt, duration_ms(request.invisible_duration))
        except GmsError as err:
            return service_pb2.ChangeInvisibleDurationResponse(status=error_status(err))
        # gms keeps the delivery attempt: the same handle acknowledges the message afterwards.
        return service_pb2.ChangeInvisibleDurationResponse(status=status(), receipt_handle=request.receipt_handle)

    async def _change_invisible(self, group: str, receipt: Receipt, invisible_ms: int) -> None:
        self.broker.services.consumption.change_invisible(group, receipt.topic, receipt.queue_id, receipt.offset,
                                                          receipt.attempt, invisible_ms)


    async def ForwardMessageToDeadLetterQueue(self, request: Any, context: Any) -> Any:
        """The message of a receipt handle to the group's dead-letter topic (the application gave up on it)."""
        try:
            receipt = _receipt(request.receipt_handle, request.topic.name)
            self.renewals.release(request.group.name, [receipt])
            # Only a delivery the group has in flight (else INVALID_RECEIPT_HANDLE), invisible while it is copied.
            await self._change_invisible(request.group.name, receipt, INVISIBLE_MS)
            found = self.broker.services.messages.entry(receipt.topic, receipt.queue_id, receipt.offset)
            if found is None:
                raise ReceiptHandleExpiredError(f"no message at {receipt.topic}/{receipt.queue_id}@{receipt.offset}")
            await self._dead_letter(request.group.name, receipt.topic, bytes(found), receipt.attempt,
                                    "forwarded by a RocketMQ client")
        except GmsError as err:
            return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=error_status(err))
        return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=status())

    # -- offsets: RocketMQ 5's pull consumer (gms.broker.rocketmq.offsets) ------------------------

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        try:
            return service_pb2.QueryOffsetResponse(status=status(), offset=await self.offsets.query(request))
        except GmsError as err:
            return service_pb2.QueryOffsetResponse(status=error_status(err))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        try:
            return service_pb2.GetOffsetResponse(status=status(), offset=await self.offsets.get(request))
        except GmsError as err:
            return service_pb2.GetOffsetResponse(status=error_status(err))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        try:
            await self.offsets.update(request)
        except GmsError as err:
            return service_pb2.UpdateOffsetResponse(status=error_status(err))
        return service_pb2.UpdateOffsetResponse(status=status())

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """The status, the messages, then the offset to pull from next."""
        poll_ms = max(_long_polling_ms(request) - POLL_MARGIN_MS, 0)
        try:
            pulled = await self.offsets.pull(request, poll_ms)
        except GmsError as err:
            yield service_pb2.PullMessageResponse(status=error_status(err))
            return
        yield service_pb2.PullMessageResponse(status=pulled.status)
        for message in pulled.messages:
            yield service_pb2.PullMessageResponse(message=message)
        yield service_pb2.PullMessageResponse(next_offset=pulled.next_offset)


def _receipt(handle: str, topic: str) -> Receipt:
    """The receipt of a handle sent with a request about ``topic``."""
    receipt = Receipt.decode(handle)
    if receipt.topic != topic:
        raise BadRequestError(f"the receipt handle is of topic {receipt.topic!r}, not {topic!r}")
    return receipt


def _long_polling_ms(request: Any) -> int:
    """A receive's or pull's long polling timeout, clamped as RocketMQ's proxy clamps it."""
    return min(max(duration_ms(request.long_polling_timeout), 0), LONG_POLLING_MAX_MS)


def _client_id(context: Any) -> str:
    """The id a RocketMQ client sends with every request ("" if none)."""
    return next((value for key, value in context.invocation_metadata() or () if key == "x-mq-client-id"), "")


def _broker(name: str, endpoint: str) -> Any:
    """A RocketMQ broker entry: clients send to and receive from its (only) address."""
    host, port = split_address(endpoint, "rocketmq endpoint")
    broker = definition_pb2.Broker(name=name, id=0)  # id 0: the master, the only one clients use
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        broker.endpoints.scheme = definition_pb2.AddressScheme.DOMAIN_NAME
    else:
        broker.endpoints.scheme = (definition_pb2.AddressScheme.IPv4 if version == 4
                                   else definition_pb2.AddressScheme.IPv6)
    broker.endpoints.addresses.add(host=host, port=port)
    return broker


def _not_implemented(name: str, response_type: Any, streaming: bool) -> Callable[..., Any]:
    message = f"{name} is not implemented by gms yet (docs/rocketmq-compat.md)"
    if streaming:
        async def stream(self: MessagingService, request: Any, context: Any) -> AsyncIterator[Any]:
            yield response_type(status=status(Code.NOT_IMPLEMENTED, message))
        return stream

    async def unary(self: MessagingService, request: Any, context: Any) -> Any:
        return response_type(status=status(Code.NOT_IMPLEMENTED, message))
    return unary


# Every RPC of the service this module does not define answers NOT_IMPLEMENTED (never UNIMPLEMENTED
# from gRPC, which clients retry or report vaguely).
for _method in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods:
    if _method.name not in MessagingService.__dict__:
        setattr(MessagingService, _method.name, _not_implemented(
            _method.name, getattr(service_pb2, _method.output_type.name), _method.server_streaming))


class RocketMQEndpoint:
    """The gRPC server of :class:`MessagingService` on the running event loop."""

    def __init__(self, server: Any, port: int, endpoint: str, service: MessagingService) -> None:
        self.server = server
        self.port = port
        self.endpoint = endpoint  # host:port clients are told to use
        self.service = service

    @classmethod
    async def start(cls, broker: BrokerServer, host: str, port: int, advertised_host: str) -> RocketMQEndpoint:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20),
                                          ("grpc.max_send_message_length", 64 << 20)])
        bound = server.add_insecure_port(join_address(host, port))
        if bound == 0:
            raise OSError(f"cannot listen for RocketMQ clients on {join_address(host, port)}")
        endpoint = join_address(advertised_host, bound)
        service = MessagingService(broker, endpoint)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, server)
        await server.start()
        service.renewals.start()
        return cls(server, bound, endpoint, service)

    async def stop(self, grace_s: float = 1.0) -> None:
        await asyncio.shield(self.server.stop(grace_s))
        await self.service.renewals.stop()
