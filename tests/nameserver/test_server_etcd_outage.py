"""etcd dies under a running nameserver: routes keep coming from the cache, the status says
unhealthy, topic changes fail with SERVICE_UNAVAILABLE, and everything recovers with etcd."""

from __future__ import annotations

import os
import signal

from processes import wait_until
from test_server_helpers import RunningNameServer

from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata
from gms.cluster.model import BrokerInfo
from gms.errors import ServiceUnavailableError
from gms.nameserver.embedded_etcd import EmbeddedEtcd
from gms.protocol.codes import RequestCode as C

BROKER_TTL_S = 5  # longer than the outage: the lease survives in etcd's persisted state


def test_etcd_killed_and_restarted(tmp_path):
    etcd = EmbeddedEtcd(tmp_path / "etcd").start()
    port = int(etcd.endpoint.rpartition(":")[2])
    client = EtcdClient(etcd.endpoint, timeout_s=2.0)
    registration = ClusterMetadata(client).register_broker(
        BrokerInfo("b0", "10.0.0.1:10911"), ttl_s=BROKER_TTL_S
    )
    ns = RunningNameServer(etcd.endpoint, DEFAULT_PREFIX)
    try:
        route = ns.call(C.CREATE_TOPIC, {"topic": "t", "queues": 2})

        os.kill(etcd.pid, signal.SIGKILL)
        etcd.stop()
        wait_until(lambda: ns.call(C.CLUSTER_STATUS)["etcd"]["healthy"] is False, 10)
        status = ns.call(C.CLUSTER_STATUS)
        assert "unreachable" in status["etcd"]["error"]
        assert status["topics"] == 1 and [b["broker_id"] for b in status["brokers"]] == ["b0"]
        assert ns.call(C.GET_ROUTE, {"topic": "t", "settings": True}) == route  # from the cache
        assert ns.call(C.TOPIC_LIST) == {"topics": {"t": 2}}
        for code, fields in [
            (C.CREATE_TOPIC, {"topic": "u"}),
            (C.CREATE_TOPICS, {"topics": [{"topic": "u"}, {"topic": "v"}]}),
            (C.UPDATE_TOPIC, {"topic": "t", "queues": 4}),
            (C.DELETE_TOPIC, {"topic": "t"}),
        ]:
            try:
                ns.call(code, fields)
            except ServiceUnavailableError as err:
                assert "etcd" in str(err) and "unreachable" in str(err)
                assert err.retriable
            else:
                raise AssertionError(f"{code.name} succeeded without etcd")

        etcd = EmbeddedEtcd(tmp_path / "etcd", client_port=port).start()
        wait_until(lambda: ns.call(C.CLUSTER_STATUS)["etcd"]["healthy"] is True, 20)
        created = ns.call(C.CREATE_TOPIC, {"topic": "u", "queues": 3})
        assert [q["leader"] for q in created["queues"]] == ["10.0.0.1:10911"] * 3
        assert ns.call(C.TOPIC_LIST) == {"topics": {"t": 2, "u": 3}}
        assert [n["address"] for n in ns.call(C.CLUSTER_STATUS)["nameservers"]] == [ns.address]
    finally:
        ns.stop()
        registration.close()
        client.close()
        etcd.stop()
