"""A registered broker follows etcd to new endpoints: when etcd stops answering, it asks the
nameservers again and moves its etcd client, keeping its lease, key and watch."""

from __future__ import annotations

import time

from processes import wait_until
from test_registration import Recorder
from test_server_helpers import RunningNameServer

from gms.broker.registration import BrokerRegistration
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.model import BrokerInfo
from gms.nameserver.embedded_etcd import EmbeddedEtcd, free_port
from gms.protocol.codes import RequestCode as C

PREFIX = "/gms-move/"
TTL_S = 3


def broker_lease(endpoint: str) -> int:
    with EtcdClient(endpoint, timeout_s=2.0) as client:
        kv = client.get(f"{PREFIX}brokers/b1")
        assert kv is not None, "the broker is not registered"
        return kv.lease_id


def test_broker_reconnects_to_etcd_named_by_another_nameserver(tmp_path):
    etcd = EmbeddedEtcd(tmp_path / "etcd").start()
    first = RunningNameServer(etcd.endpoint, PREFIX)
    second_port = free_port()  # the second nameserver is not running yet
    recorder = Recorder()
    reg = BrokerRegistration(f"{first.address},127.0.0.1:{second_port}", BrokerInfo("b1", "10.0.0.2:10911"),
                             recorder, ttl_s=TTL_S)
    second = None
    try:
        reg.start()
        lease = broker_lease(etcd.endpoint)
        old_endpoint = etcd.endpoint

        # etcd moves: same data, another client port; only the second nameserver knows.
        first.stop()
        etcd.stop()
        etcd = EmbeddedEtcd(tmp_path / "etcd", client_port=free_port()).start()
        assert etcd.endpoint != old_endpoint
        second = RunningNameServer(etcd.endpoint, PREFIX, listen=f"127.0.0.1:{second_port}")
        back = time.monotonic()

        wait_until(lambda: reg.etcd_endpoints == etcd.endpoint and reg.alive, TTL_S)
        assert time.monotonic() - back < TTL_S
        assert broker_lease(etcd.endpoint) == lease  # the same registration, not a new one
        assert [b["broker_id"] for b in second.call(C.GET_BROKER_LIST)["brokers"]] == ["b1"]

        second.call(C.CREATE_TOPIC, {"topic": "after-move", "queues": 2})
        wait_until(lambda: "after-move" in recorder.last, 5)  # the watch follows the new etcd
    finally:
        reg.stop()
        if second is not None:
            second.stop()
        etcd.stop()
