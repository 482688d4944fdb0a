"""Keeping a push consumer's messages invisible while it works on them (``auto_renew``).

A RocketMQ ``PushConsumer`` receives with ``auto_renew`` and no invisible duration: the server
picks one and extends it while the client still holds the message, as RocketMQ's proxy does
(60 s, renewed 10 s before it ends, for at most 3 hours). A message held stops being renewed when
it is acknowledged, its invisible duration changed or it is forwarded to the dead letters, when
its client says it terminates or stops heartbeating, or when a renewal finds the delivery gone.
Renewals are gms's own CHANGE_INVISIBLE_DURATION: the same receipt handle keeps working.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from gms.broker.rocketmq.mapping import Receipt
from gms.errors import GmsError

log = logging.getLogger(__name__)

INVISIBLE_MS = 60_000  # what an auto-renewed receive's messages start with, and each renewal gives
RENEW_AHEAD_S = 10.0
RENEW_FOR_AT_MOST_S = 3 * 3600.0
RENEW_EVERY_S = 1.0
CLIENT_SILENT_S = 60.0  # clients heartbeat every 10 s: one silent this long is gone

# (group, receipt) → one renewal of INVISIBLE_MS; raises GmsError if the delivery is gone.
Renew = Callable[[str, Receipt, int], Awaitable[None]]


@dataclass(slots=True)
class _Held:
    client_id: str
    group: str
    receipt: Receipt
    visible_at: float  # monotonic
    held_since: float


class Renewals:
    def __init__(self, renew: Renew) -> None:
        self._renew = renew
        self._held: dict[tuple[str, str, int, int], _Held] = {}  # (group, topic, queue, offset)
        self._seen: dict[str, float] = {}  # client id: when last heard of
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def hold(self, client_id: str, group: str, receipts: Iterable[Receipt]) -> None:
        now = time.monotonic()
        self.seen(client_id)
        for receipt in receipts:
            self._held[_key(group, receipt)] = _Held(client_id, group, receipt, now + INVISIBLE_MS / 1000, now)

    def release(self, group: str, receipts: Iterable[Receipt]) -> None:
        for receipt in receipts:
            self._held.pop(_key(group, receipt), None)

    def seen(self, client_id: str) -> None:
        if client_id:
            self._seen[client_id] = time.monotonic()

    def client_gone(self, client_id: str) -> None:
        self._seen.pop(client_id, None)
        self._held = {key: held for key, held in self._held.items() if held.client_id != client_id}

    @property
    def held(self) -> int:
        return len(self._held)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            await self._renew_due()

    async def _renew_due(self) -> None:
        now = time.monotonic()
        for client_id in [c for c, at in self._seen.items() if now - at > CLIENT_SILENT_S]:
            log.info("RocketMQ client %s stopped heartbeating: its messages are no longer renewed", client_id)
            self.client_gone(client_id)
        for key, held in list(self._held.items()):
            if held.visible_at - now > RENEW_AHEAD_S:
                continue
            if now - held.held_since > RENEW_FOR_AT_MOST_S:
                del self._held[key]
                continue
            try:
                await self._renew(held.group, held.receipt, INVISIBLE_MS)
            except GmsError as err:  # acknowledged elsewhere, handed out again, or the queue moved
                log.debug("renewing %s: %r", key, err)
                if self._held.get(key) is held:
                    del self._held[key]
            else:
                held.visible_at = time.monotonic() + INVISIBLE_MS / 1000


def _key(group: str, receipt: Receipt) -> tuple[str, str, int, int]:
    return group, receipt.topic, receipt.queue_id, receipt.offset
