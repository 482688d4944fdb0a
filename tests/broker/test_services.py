"""The broker's services called as a protocol adapter calls them (docs/architecture.md): typed
arguments in, typed results or gms.errors out, no frame. A real broker runs in this process
(its store in tmp_path, an ephemeral port on 127.0.0.1) and every capability a new protocol
needs is reached through ``broker.services`` alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gms.broker.config import BrokerConfig
from gms.broker.server import BrokerServer
from gms.broker.services.consumption import PopArgs
from gms.broker.services.messages import PullArgs
from gms.broker.store import GetStatus
from gms.errors import BadRequestError, OffsetIllegalError, ReceiptHandleExpiredError, TopicNotFoundError
from gms.protocol.groups import QueueOffset, QueueRef
from gms.record import decode_record, encode_record, iter_records


async def _with_broker(tmp_path: Path, check) -> None:
    broker = BrokerServer(BrokerConfig(listen="127.0.0.1:0", store_dir=tmp_path / "broker"))
    await broker.start()
    try:
        await check(broker)
    finally:
        await broker.stop()


def test_a_protocol_reaches_every_capability_through_the_services(tmp_path):
    async def check(broker: BrokerServer) -> None:
        services = broker.services
        assert await services.topics.create_topic("orders", 1, {}) == 1
        for body in (b"one", b"two"):
            stored = await services.messages.stored(encode_record(topic="orders", body=body, tag="a", queue_id=0), 1)
            assert stored.queue_ids.tolist() == [0]
        assert (services.messages.min_offset("orders", 0), services.messages.max_offset("orders", 0)) == (0, 2)

        pulled = await services.messages.pull(PullArgs("orders", 0, 0, tags="a"))
        assert pulled.status is GetStatus.FOUND
        assert [bytes(r.body) for v in pulled.records for r in iter_records(v, False)] == [b"one", b"two"]
        with pytest.raises(OffsetIllegalError):
            await services.messages.pull(PullArgs("orders", 0, 5))

        popped = await services.consumption.pop(PopArgs("g", "orders", invisible_ms=60_000, start="first"))
        offsets = [r.queue_offset for v in popped.fresh for r in iter_records(v, False)]
        assert offsets == [0, 1] and popped.exhausted == [] and popped.again == []
        expired = services.consumption.ack("g", "orders", np.array([0], np.int32), np.array([0], np.int64),
                                           np.array([1], np.int32))
        assert expired == []
        with pytest.raises(ReceiptHandleExpiredError):  # acknowledged: its handle no longer holds
            services.consumption.change_invisible("g", "orders", 0, 0, 1, 1000)
        assert services.consumption.change_invisible("g", "orders", 0, 1, 1, 1000) > 0

        await services.groups.commit_offsets("pulling", [QueueOffset("orders", 0, 2)])
        assert services.groups.committed_offsets("pulling", [QueueRef("orders", 0)]) == [2]
        with pytest.raises(BadRequestError):
            services.groups.committed_offsets("", [QueueRef("orders", 0)])

        header = decode_record(services.messages.view(int(stored.phys_offsets[0])), verify_crc=True)
        assert (header.topic, header.queue_offset) == ("orders", 1)
        with pytest.raises(TopicNotFoundError):
            await services.messages.pull(PullArgs("nothing", 0, 0))

    asyncio.run(_with_broker(tmp_path, check))
