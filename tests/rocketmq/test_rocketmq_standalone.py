"""`gms standalone` serves the RocketMQ 5 gRPC API (free ports here, never the default 8081): the
official client sends and receives through the port its banner prints."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

rocketmq = pytest.importorskip("rocketmq", reason="the official RocketMQ client is the `rocketmq` extra")

from gms.client import Admin  # noqa: E402
from tests.cli.test_cli_standalone import read_addresses  # noqa: E402
from tests.processes import FREE_MONITORING_PORTS, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(90)

def test_standalone_serves_the_rocketmq_api(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(tmp_path / "data"),
         "--nameserver-port", "0", "--broker-port", "0", "--no-console", *FREE_MONITORING_PORTS,
         "--commitlog-file-size", str(32 << 20)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = read_addresses(proc)
        endpoint = banner["rocketmq"].split()[0]
        assert endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":8081")
        with Admin(nameserver=banner["nameserver"]) as admin:
            wait_until(lambda: bool(admin.cluster_status()["brokers"]), 15)
            admin.create_topic("rmq-standalone", 2)
        config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials())
        consumer = rocketmq.SimpleConsumer(config, "g-standalone",
                                          {"rmq-standalone": rocketmq.FilterExpression("*")}, await_duration=1)
        consumer.startup()
        producer = rocketmq.Producer(config, ("rmq-standalone",))
        producer.startup()
        try:
            consumer.receive(16, 10)  # places the new group at the end of the queues
            message = rocketmq.Message()
            message.topic, message.body, message.tag = "rmq-standalone", b"through standalone", "T"
            sent = producer.send(message)
            received: list = []
            wait_until(lambda: bool(received.extend(consumer.receive(16, 10)) or received), 15)
            assert [(m.message_id, m.body) for m in received] == [(sent.message_id, b"through standalone")]
            consumer.ack(received[0])
        finally:
            producer.shutdown()
            consumer.shutdown()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
