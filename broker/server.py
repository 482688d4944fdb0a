"""The broker: a message store served over the gms wire protocol.

Wires the store, consumer groups, long polling and the request handlers into
one :class:`gms.net.RpcServer`, and runs the broker's periodic chores
(persisting committed offsets, expiring silent group members).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from gms.broker.admin_handlers import AdminHandlers
from gms.broker.config import BrokerConfig
from gms.broker.group_handlers import GroupHandlers
from gms.broker.groups import GroupCoordinator
from gms.broker.long_poll import PullWaiters
from gms.broker.message_handlers import MessageHandlers
from gms.broker.offsets import OffsetStore
from gms.broker.store import MessageStore
from gms.net import RpcServer
from gms.protocol.codes import RequestCode

log = logging.getLogger(__name__)


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.store = MessageStore(config.store_dir / "store", config.store)
        self.offsets = OffsetStore(config.store_dir / "store" / "config" / "consumer_offsets.json")
        self.groups = GroupCoordinator(self._local_queue_ids, config.member_expiry_ms)
        self.waiters = PullWaiters()
        self.rpc = RpcServer()
        self.address = ""
        self.name = config.broker_name
        self.started_monotonic = time.monotonic()
        self._chores: list[asyncio.Task[None]] = []

    @property
    def port(self) -> int:
        return self.rpc.port

    def _local_queue_ids(self, topic: str) -> list[int]:
        return list(range(self.store.topics().get(topic, 0)))

    async def start(self) -> None:
        self.store.open()
        if self.store.recovered_from_crash:
            log.warning("the last run did not stop cleanly; the store was recovered")
        host, port = self.config.host_port
        try:
            await self.rpc.start(host, port)
        except OSError:
            self.store.close()
            raise
        self.address = self.config.advertised_address or _advertised(host, self.rpc.port)
        self.name = self.config.broker_name or self.address
        self._register_handlers()
        self.started_monotonic = time.monotonic()
        self._chores = [
            asyncio.create_task(self._every(self.config.offset_persist_interval_ms, self.offsets.persist)),
            asyncio.create_task(self._every(1000, self._expire_members)),
        ]

    def _register_handlers(self) -> None:
        messages = MessageHandlers(self.config, self.store, self.waiters, self.groups, self.address)
        groups = GroupHandlers(self.groups, self.offsets, lambda t: t in self.store.topics())
        admin = AdminHandlers(self)
        for code, handler in {
            RequestCode.SEND: messages.send,
            RequestCode.SEND_BATCH: messages.send,
            RequestCode.PULL: messages.pull,
            RequestCode.QUERY_MIN_OFFSET: messages.query_min_offset,
            RequestCode.QUERY_MAX_OFFSET: messages.query_max_offset,
            RequestCode.QUERY_OFFSET_BY_TIME: messages.query_offset_by_time,
            RequestCode.VIEW_MESSAGE_BY_ID: messages.view_message,
            RequestCode.HEARTBEAT: groups.heartbeat,
            RequestCode.UNREGISTER_CONSUMER: groups.unregister,
            RequestCode.COMMIT_OFFSET: groups.commit,
            RequestCode.FETCH_OFFSET: groups.fetch,
            RequestCode.GET_CONSUMER_GROUP_MEMBERS: groups.describe,
            RequestCode.CREATE_TOPIC: admin.create_topic,
            RequestCode.UPDATE_TOPIC: admin.update_topic,
            RequestCode.DELETE_TOPIC: admin.delete_topic,
            RequestCode.TOPIC_LIST: admin.topic_list,
            RequestCode.TOPIC_STATS: admin.topic_stats,
            RequestCode.BROKER_STATUS: admin.broker_status,
        }.items():
            self.rpc.register(code, handler)

    async def _every(self, interval_ms: int, chore) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                chore()
            except Exception:  # a failed chore must not stop the broker; it is retried next time
                log.exception("periodic task %s failed", getattr(chore, "__name__", chore))

    def _expire_members(self) -> None:
        for group, member in self.groups.expire(int(time.time() * 1000)):
            log.info("consumer %s of group %s expired", member, group)

    async def stop(self) -> None:
        for task in self._chores:
            task.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        self.waiters.close()
        await self.rpc.stop()
        self.offsets.persist()
        self.store.close()


def _advertised(host: str, port: int) -> str:
    """The address to publish when listening on a wildcard: this host's primary address."""
    if host in ("0.0.0.0", "::", ""):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
