"""With TLS, authentication and ACLs on, a SIGKILLed leader still loses no acks=-1 message: the
followers replicate over authenticated TLS connections as themselves, and a new leader takes over."""

from __future__ import annotations

import threading
import time

import pytest
from processes import wait_until
from secured_cluster import SecuredCluster

from gms.client import Consumer, Producer
from gms.errors import GmsError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BROKER_TOML = """
[broker]
lease_ttl_s = 2
replica_lag_time_max_ms = 1500
replica_fetch_wait_ms = 200
hw_checkpoint_interval_ms = 200
send_timeout_ms = 4000
"""


def test_acks_all_messages_survive_a_leader_kill_with_security_on(tmp_path):
    cluster = SecuredCluster(tmp_path, BROKER_TOML).start(brokers=3)
    try:
        with cluster.admin() as admin:
            admin.create_topic("sec-failover", queues=1, replicas=3, settings={"min_insync_replicas": 2})
            wait_until(lambda: len(admin.route("sec-failover")["queues"][0]["replicas"]) == 3, 10)
            leader = admin.route("sec-failover")["queues"][0]["leader"]
        acked: list[bytes] = []
        errors: list[GmsError] = []
        stop = threading.Event()

        def produce() -> None:
            with Producer(nameserver=cluster.nameserver, security=cluster.security("admin"), acks=-1, retries=60,
                          retry_backoff_ms=20, linger_ms=0, request_timeout_ms=5000) as producer:
                i = 0
                while not stop.is_set():
                    body = b"m%d" % i
                    i += 1
                    try:
                        producer.send("sec-failover", body)
                    except GmsError as err:
                        errors.append(err)
                        continue
                    acked.append(body)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        wait_until(lambda: len(acked) >= 200, 20)
        next(b for b in cluster.brokers if b.address == leader).kill()
        count_at_kill = len(acked)
        wait_until(lambda: len(acked) >= count_at_kill + 200, 30)  # the new leader takes acks=-1 sends
        stop.set()
        thread.join(30)
        with cluster.admin() as admin:
            assert admin.route("sec-failover")["queues"][0]["leader"] not in (None, leader)
        consumer = Consumer(nameserver=cluster.nameserver, group="sec-failover-check",
                            subscription={"sec-failover": "*"}, start_from="first",
                            security=cluster.security("admin"))
        try:
            seen: set[bytes] = set()
            deadline = time.monotonic() + 30
            while not set(acked) <= seen and time.monotonic() < deadline:
                seen.update(bytes(m.body) for m in consumer.poll(timeout_ms=500))
        finally:
            consumer.close()
        assert set(acked) <= seen, f"{len(set(acked) - seen)} of {len(acked)} acknowledged messages lost"
    finally:
        cluster.stop()
