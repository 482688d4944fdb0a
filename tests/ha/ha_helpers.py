"""Helpers of the replication tests: a LocalCluster whose brokers fail over fast, topic
creation with replicas, reading ISRs from etcd and every replica's store after a run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gms_cluster import COMMITLOG_FILE_SIZE_BYTES, LocalCluster
from processes import TEST_CQ_FILE_ENTRIES, BrokerProcess

from gms.broker.server import broker_id_for
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_config import StoreConfig
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.cluster.model import TopicMetadata
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import decode_record

LEASE_TTL_S = 2
LAG_MAX_MS = 1500
BROKER_TOML = f"""
[broker]
lease_ttl_s = {LEASE_TTL_S}
replica_lag_time_max_ms = {LAG_MAX_MS}
replica_fetch_wait_ms = 200
hw_checkpoint_interval_ms = 200
send_timeout_ms = 4000
"""


class HaCluster(LocalCluster):
    def __init__(self, root: Path, broker_args: tuple[str, ...] = ()) -> None:
        super().__init__(root)
        self.broker_args = broker_args

    def add_broker(self, *args: str) -> BrokerProcess:
        config = self.root / f"broker{len(self.brokers)}.toml"
        config.write_text(BROKER_TOML)
        return super().add_broker("--config", str(config), *self.broker_args, *args)

    def metadata(self) -> ClusterMetadata:
        return ClusterMetadata(EtcdClient(self.etcd.endpoint))

    def topic(self, name: str) -> TopicMetadata:
        client = EtcdClient(self.etcd.endpoint)
        try:
            return ClusterMetadata(client).get_topic(name)
        finally:
            client.close()

    def broker_by_id(self, broker_id: str) -> BrokerProcess:
        for broker in self.brokers:
            if broker_id_for(broker.address) == broker_id:
                return broker
        raise KeyError(broker_id)

    def create_topic(self, name: str, queues: int, replicas: int = 3, min_isr: int = 2) -> None:
        request(self.nameservers[0].address, RequestCode.CREATE_TOPIC, {
            "topic": name, "queues": queues, "replicas": replicas,
            "settings": {"min_insync_replicas": min_isr}})
        # Every replica has the queue and every follower has fetched once (full ISR, HW known).
        wait_for(lambda: all(len(q.isr) == replicas for q in self.topic(name).queues), 20)
        # Every replica has the topic in its table (a broker applies a new topic in the background).
        for broker_id in {r for q in self.topic(name).queues for r in q.replicas}:
            address = self.broker_by_id(broker_id).address
            wait_for(lambda a=address: name in request(a, RequestCode.TOPIC_LIST, {})["topics"], 20)
        for q in self.topic(name).queues:
            address, fields = self.broker_by_id(q.leader).address, {"topic": name, "queue_id": q.queue_id}
            wait_for(lambda a=address, f=fields: request(a, RequestCode.QUERY_MAX_OFFSET, f), 20)


def request(address: str, code: int, fields: dict[str, Any], body: bytes = b"", timeout_ms: float = 10_000):
    async def main():
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            return (await conn.request(code, fields, body, timeout_ms=timeout_ms)).fields
        finally:
            conn.close()

    return run(main())


def wait_for(check, timeout_s: float = 10.0, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as err:  # noqa: BLE001 - retried until the deadline
            last = err
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s (last error: {last!r})")


def read_store(store_dir: Path, topic: str, queue_id: int) -> list[tuple[int, bytes]]:
    """Every (queue offset, body) of a stopped broker's queue, CRC-checked, straight from its
    files (recovery included)."""
    out: list[tuple[int, bytes]] = []
    with MessageStore(store_dir / "store", StoreConfig(commitlog_file_size_bytes=COMMITLOG_FILE_SIZE_BYTES,
                                                        cq_entries_per_file=TEST_CQ_FILE_ENTRIES)) as store:
        if topic not in store.topics():
            return out
        offset = store.min_offset(topic, queue_id)
        while True:
            result = store.get(topic, queue_id, offset, 1024)
            if result.status is not GetStatus.FOUND:
                return out
            for view in result.records:
                record = decode_record(bytes(view))
                out.append((record.queue_offset, bytes(record.body)))
            offset = result.next_offset
