"""Transactions follow their queues' leadership: half messages sent with acks=-1 are on every
in-sync replica, so when a queue's leader is SIGKILLed the new leader holds them (``gms tx list``
shows the open transaction and its age) and commits them, each message visible once."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner
from ha_helpers import HaCluster, wait_for

from gms.cli.main import cli
from gms.client import Consumer, Producer

pytestmark = pytest.mark.timeout(180)


def test_a_new_leader_commits_the_halves_of_a_killed_one(ha_cluster: HaCluster):
    ha_cluster.create_topic("tx-ha", queues=2, replicas=3, min_isr=2)
    producer = Producer(nameserver=ha_cluster.nameserver, acks=-1, group="ha-tx", retries=20, retry_backoff_ms=200,
                        request_timeout_ms=4000)
    try:
        tx = producer.begin_transaction()
        for i in range(6):
            producer.send("tx-ha", b"ha-%d" % i, queue=i % 2, transaction=tx)
        leader_id = ha_cluster.topic("tx-ha").queues[0].leader
        ha_cluster.broker_by_id(leader_id).kill()
        wait_for(lambda: ha_cluster.topic("tx-ha").queues[0].leader not in (None, leader_id), 20)
        time.sleep(0.3)
        env = {"GMS_NAMESERVER": ha_cluster.nameserver}
        killed = ha_cluster.broker_by_id(leader_id).address

        def listed_by_the_new_leaders() -> list[dict]:
            output = CliRunner().invoke(cli, ["tx", "list", "--json"], env=env, prog_name="gms").output
            rows = [row for row in json.loads(output) if row["tx_id"] == tx.tx_id]
            queues = sorted(q for row in rows for _, q, _ in row["queues"])
            return rows if queues == [0, 1] and killed not in {row["broker"] for row in rows} else []
        listed = wait_for(listed_by_the_new_leaders, 20)
        assert all(row["group"] == "ha-tx" and row["age_ms"] > 0 and row["state"] == "open" for row in listed)
        assert sum(row["messages"] for row in listed) == 6
        table = CliRunner().invoke(cli, ["tx", "list"], env=env, prog_name="gms")
        assert table.exit_code == 0 and tx.tx_id[:12] in table.output and "ha-tx" in table.output, table.output
        tx.commit()  # the new leader of queue 0 (and queue 1's, wherever it is)
    finally:
        producer.close()
    consumer = Consumer(nameserver=ha_cluster.nameserver, group="g", subscription={"tx-ha": "*"},
                        start_from="first")
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 6 and time.monotonic() < deadline:
            got += [bytes(m.body) for m in consumer.poll(timeout_ms=200)]
        time.sleep(1.0)
        got += [bytes(m.body) for m in consumer.poll(timeout_ms=500)]  # nothing more: no duplicates
    finally:
        consumer.close()
    assert sorted(got) == [b"ha-%d" % i for i in range(6)]
