"""Renewals of auto-renewed deliveries (push consumers): renewed while held, not after an
acknowledgement, the client's termination or silence, or a failed renewal. Timings shortened."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("rocketmq", reason="the RocketMQ API is the `rocketmq` extra: pip install '.[rocketmq]'")

from gms.broker.rocketmq import renewals as module
from gms.broker.rocketmq.mapping import Receipt
from gms.errors import ReceiptHandleExpiredError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setattr(module, "INVISIBLE_MS", 300)
    monkeypatch.setattr(module, "RENEW_AHEAD_S", 0.2)
    monkeypatch.setattr(module, "RENEW_EVERY_S", 0.02)
    monkeypatch.setattr(module, "CLIENT_SILENT_S", 1.0)


def _receipt(offset: int) -> Receipt:
    return Receipt("t", 0, offset, 1, "127.0.0.1:1")


def test_held_deliveries_are_renewed_until_released_or_their_client_goes():
    renewed: list[tuple[str, int, int]] = []

    async def renew(group: str, receipt: Receipt, invisible_ms: int) -> None:
        if receipt.offset == 3:
            raise ReceiptHandleExpiredError("handed out again")
        renewed.append((group, receipt.offset, invisible_ms))

    async def scenario() -> None:
        renewals = module.Renewals(renew)
        renewals.start()
        renewals.hold("c1", "g", [_receipt(1), _receipt(2), _receipt(3)])
        renewals.hold("c2", "g", [_receipt(4)])
        await asyncio.sleep(0.5)
        assert {offset for _, offset, _ in renewed} == {1, 2, 4}  # 3 failed: dropped
        assert renewals.held == 3
        renewals.release("g", [_receipt(1)])  # acknowledged
        renewals.client_gone("c2")  # NotifyClientTermination
        renewed.clear()
        await asyncio.sleep(0.5)
        assert {offset for _, offset, _ in renewed} == {2}
        assert all(invisible == 300 for _, _, invisible in renewed)
        await asyncio.sleep(1.2)  # c1 stopped heartbeating
        assert renewals.held == 0
        await renewals.stop()

    asyncio.run(scenario())
