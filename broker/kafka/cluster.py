"""The cluster as Kafka clients see it: ApiVersions, Metadata, DescribeCluster, FindCoordinator,
CreateTopics and DeleteTopics, answered from the topic and group services.

A broker is a Kafka node: its id is a stable 31-bit hash of its gms broker id (Kafka's node ids are
int32, gms's are names), its host and port are the Kafka address it registered in etcd
(``BrokerInfo.kafka``). A broker without nameservers is the only node. A topic's queues are its
partitions, each with its leader, replicas and ISR as the cluster routes them. gms has no Kafka
controller (its nameservers place the queues, and any broker takes the admin requests): Metadata
and DescribeCluster name the same one, the smallest node id of the live brokers serving Kafka,
so that every broker answers alike.
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from gms.address import split_address
from gms.broker.kafka.apis import api_versions_body
from gms.broker.kafka.configs import ConfigError, topic_settings
from gms.broker.kafka.errors import Err, code_of
from gms.broker.kafka.idempotence import TRANSACTIONS_REFUSED
from gms.broker.services import Services
from gms.cluster.model import BrokerInfo
from gms.errors import GmsError
from gms.naming import validate_topic_name

CLUSTER_ID = "gms"
AUTHORIZED_OPERATIONS_OMITTED = -(1 << 31)
BROKERS_ENDPOINT = 1  # DescribeCluster's endpoint type of the brokers (2: the controllers)
DEFAULT_REPLICAS = 1  # CreateTopics' replication factor -1 on a cluster
TOPIC_WAIT_S = 10.0  # CreateTopics waits this long (at most its timeout) for this broker's view


def node_id(broker_id: str) -> int:
    return zlib.crc32(broker_id.encode()) & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class Node:
    node_id: int
    host: str
    port: int
    address: str  # the broker's gms address

    def row(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "port": self.port, "rack": None}


class Cluster:
    """The cluster-wide answers of one broker's Kafka endpoint (``endpoint``: its Kafka address)."""

    def __init__(self, services: Services, broker_id: str, address: str, endpoint: str,
                 default_queue_count: int) -> None:
        self.services = services
        host, port = split_address(endpoint, "kafka endpoint")
        self.me = Node(node_id(broker_id), host, port, address)
        self.default_queue_count = default_queue_count

    def nodes(self) -> dict[str, Node]:
        """gms address -> Kafka node, of the live brokers serving Kafka (this one at least)."""
        brokers = self.services.topics.live_brokers()
        found = {self.me.address: self.me}
        for info in brokers or ():
            node = _node(info)
            if node is not None:
                found[info.address] = node
        return found

    def api_versions(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        return api_versions_body()

    def metadata(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        nodes = self.nodes()
        counts = self.services.topics.queue_counts()
        asked = req.get("topics")
        names = sorted(counts) if asked is None or (version == 0 and not asked) else [t["name"] for t in asked]
        return {"brokers": [node.row() for node in nodes.values()], "cluster_id": CLUSTER_ID,
                "controller_id": _controller(nodes), "topics": [self._topic(name, counts, nodes) for name in names]}

    def describe_cluster(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        """The brokers (v1+: asked for the brokers' endpoints; the controllers' are not served,
        as a Kafka broker's listener answers). No broker is fenced: a dead one is not listed."""
        if req.get("endpoint_type", BROKERS_ENDPOINT) != BROKERS_ENDPOINT:
            return {"error_code": Err.MISMATCHED_ENDPOINT_TYPE, "cluster_id": CLUSTER_ID,
                    "error_message": "gms brokers serve the brokers' endpoints (type 1) only"}
        nodes = self.nodes()
        return {"error_code": 0, "error_message": None, "cluster_id": CLUSTER_ID, "controller_id": _controller(nodes),
                "brokers": [{"broker_id": node.node_id, "host": node.host, "port": node.port, "rack": None}
                            for node in nodes.values()],
                "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    def _topic(self, name: str, counts: dict[str, int], nodes: dict[str, Node]) -> dict[str, Any]:
        row: dict[str, Any] = {"name": name, "topic_id": uuid.UUID(int=0), "is_internal": False,
                               "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        if name not in counts:
            return {**row, "error_code": Err.UNKNOWN_TOPIC_OR_PARTITION, "partitions": []}
        try:
            queues = self.services.topics.placement(name)
        except GmsError as err:
            return {**row, "error_code": code_of(err), "partitions": []}
        me = self.me.node_id
        if queues is None:  # a broker without nameservers serves every queue alone
            row["partitions"] = [{"partition_index": q, "leader_id": me, "leader_epoch": 0, "replica_nodes": [me],
                                  "isr_nodes": [me], "offline_replicas": []} for q in range(counts[name])]
            return row

        def ids(brokers: tuple[BrokerInfo, ...]) -> list[int]:
            return [nodes[b.address].node_id for b in brokers if b.address in nodes]
        partitions = []
        for queue in queues:
            leader = nodes.get(queue.leader.address) if queue.leader is not None else None
            partitions.append({
                "error_code": Err.NONE if leader is not None else Err.LEADER_NOT_AVAILABLE,
                "partition_index": queue.queue_id, "leader_id": leader.node_id if leader else -1,
                "leader_epoch": queue.leader_epoch, "replica_nodes": ids(queue.assigned),
                "isr_nodes": ids(queue.isr), "offline_replicas": []})
        row["partitions"] = partitions
        return row

    def find_coordinator(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        if version < 4:
            found = self._coordinator(req["key"], req.get("key_type", 0))
            return {"throttle_time_ms": 0, **{k: v for k, v in found.items() if k != "key"}}
        return {"coordinators": [self._coordinator(key, req["key_type"]) for key in req["coordinator_keys"]]}

    def _coordinator(self, key: str, key_type: int) -> dict[str, Any]:
        """A group's coordinator: the broker gms's group coordinator is on."""
        none = {"key": key, "node_id": -1, "host": "", "port": -1}
        if key_type != 0:
            return {**none, "error_code": Err.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "error_message": TRANSACTIONS_REFUSED}
        try:
            address = self.services.groups.coordinator(key)
        except GmsError as err:
            return {**none, "error_code": code_of(err), "error_message": str(err)}
        node = self.nodes().get(address)
        if node is None:
            return {**none, "error_code": Err.COORDINATOR_NOT_AVAILABLE,
                    "error_message": f"the coordinator {address} serves no Kafka API"}
        return {"key": key, "node_id": node.node_id, "host": node.host, "port": node.port, "error_code": 0,
                "error_message": None}

    async def create_topics(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        rows = []
        timeout_s = min(max(req.get("timeout_ms", 0), 0) / 1000, TOPIC_WAIT_S)
        for topic in req["topics"]:
            rows.append(await self._create(topic, req.get("validate_only", False), timeout_s))
        return {"topics": rows}

    async def _create(self, topic: dict[str, Any], validate_only: bool, timeout_s: float) -> dict[str, Any]:
        name = topic["name"]
        queues = topic["num_partitions"]
        replicas = topic["replication_factor"]
        row: dict[str, Any] = {"name": name, "topic_id": uuid.UUID(int=0), "configs": None}
        if queues == -1:
            queues = self.default_queue_count
        if replicas == -1:
            replicas = DEFAULT_REPLICAS
        if topic["assignments"]:
            return {**row, "error_code": Err.INVALID_REQUEST,
                    "error_message": "manual replica assignments are not supported: gms places the queues"}
        if queues < 1:
            return {**row, "error_code": Err.INVALID_PARTITIONS, "error_message": f"{queues} partitions"}
        if replicas < 1:
            return {**row, "error_code": Err.INVALID_REPLICATION_FACTOR, "error_message": f"{replicas} replicas"}
        try:
            settings = topic_settings([(config["name"], config["value"]) for config in topic["configs"]])
        except ConfigError as err:
            return {**row, "error_code": Err.INVALID_CONFIG, "error_message": str(err)}
        try:
            validate_topic_name(name)
            if name in self.services.topics.queue_counts():
                return {**row, "error_code": Err.TOPIC_ALREADY_EXISTS, "error_message": f"topic {name} exists"}
            if not validate_only:
                await self.services.topics.create_in_cluster(name, queues, replicas, timeout_s, settings)
        except GmsError as err:  # InvalidTopicName: INVALID_TOPIC_EXCEPTION
            return {**row, "error_code": code_of(err), "error_message": str(err)}
        return {**row, "error_code": 0, "error_message": None, "num_partitions": queues,
                "replication_factor": replicas}

    async def delete_topics(self, req: dict[str, Any], version: int) -> dict[str, Any]:
        rows = []
        for name in req["topic_names"]:
            try:
                if name not in self.services.topics.queue_counts():
                    rows.append({"name": name, "error_code": Err.UNKNOWN_TOPIC_OR_PARTITION,
                                 "error_message": f"no topic {name}"})
                    continue
                await self.services.topics.delete_in_cluster(name)
            except GmsError as err:
                rows.append({"name": name, "error_code": code_of(err), "error_message": str(err)})
                continue
            rows.append({"name": name, "error_code": 0, "error_message": None})
        return {"responses": rows}


def _controller(nodes: dict[str, Node]) -> int:
    """The node Kafka clients are told is the controller (see the module docstring)."""
    return min(node.node_id for node in nodes.values())


def _node(info: BrokerInfo) -> Node | None:
    if not info.kafka:
        return None
    host, port = split_address(info.kafka, "kafka address")
    return Node(node_id(info.broker_id), host, port, info.address)
