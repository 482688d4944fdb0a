"""A restarted `gms-broker` is the broker its store says it is (its name, whatever the port),
and takes the store's commitlog file size and consumeQueue entries per file from the store: none
of them need be repeated, and only a value given that contradicts the store is refused, with a
message that says what to do."""

from __future__ import annotations

import subprocess
import sys
import time

from processes import BrokerProcess

from gms.client import Admin, Consumer, Producer

FILE_SIZE_BYTES = 1 << 20
CQ_ENTRIES = 1000


class _Broker(BrokerProcess):
    """A broker whose geometry flags are this test's: ``geometry`` (none: the store's own)."""

    geometry: tuple[str, ...] = ()

    def location_args(self) -> list[str]:
        return ["--store-dir", str(self.store_dir), *self.geometry]


def test_restart_takes_the_stored_geometry_and_refuses_only_a_contradiction(tmp_path):
    broker = _Broker(tmp_path / "store", [])
    broker.geometry = ("--commitlog-file-size", str(FILE_SIZE_BYTES), "--cq-file-entries", str(CQ_ENTRIES))
    broker.start()
    try:
        with Admin([broker.address]) as admin:
            admin.create_topic("t", queues=1)
        with Producer([broker.address]) as producer:
            producer.send("t", b"before")
    finally:
        assert broker.stop() == 0

    broker.geometry = ()  # nothing given: the store's own
    broker.restart()
    try:
        with Producer([broker.address]) as producer:
            producer.send("t", b"after")
        with Consumer([broker.address], group="g", subscription={"t": "*"}, start_from="first") as consumer:
            bodies: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(bodies) < 2 and time.monotonic() < deadline:
                bodies += [m.body for m in consumer.poll(200)]
        assert bodies == [b"before", b"after"]
    finally:
        assert broker.stop() == 0
    commitlog = tmp_path / "store" / "store" / "commitlog"
    assert {f.stat().st_size for f in commitlog.iterdir()} == {FILE_SIZE_BYTES}

    broker.geometry = ("--commitlog-file-size", str(FILE_SIZE_BYTES))  # the same, given: fine
    broker.restart()
    assert broker.stop() == 0

    refused = subprocess.run(
        [sys.executable, "-P", "-m", "gms.broker", "--listen", "127.0.0.1:0", "--store-dir", str(tmp_path / "store"),
         "--commitlog-file-size", str(2 * FILE_SIZE_BYTES)],
        capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1
    assert f"created with commitlog_file_size_bytes = {FILE_SIZE_BYTES}" in refused.stderr
    assert "leave out gms-broker --commitlog-file-size" in refused.stderr and "Traceback" not in refused.stderr


def _status(broker: BrokerProcess) -> dict:
    with Admin([broker.address]) as admin:
        [status] = admin.broker_status()
    return status


def test_the_broker_name_lives_in_the_store_and_survives_another_port(tmp_path):
    """The first start records the broker's name (by default its address); a restart on another
    port is the same broker; a --name that contradicts the store is refused."""
    broker = _Broker(tmp_path / "store", [])
    broker.start()
    try:
        first = _status(broker)
        assert first["name"] == broker.address
    finally:
        assert broker.stop() == 0
    broker.start()  # port 0: another port
    try:
        again = _status(broker)
        assert again["address"] == broker.address != first["address"]
        assert again["name"] == first["name"]
    finally:
        assert broker.stop() == 0
    broker.args = ["--name", first["name"]]  # the same name, given: fine
    broker.start()
    assert broker.stop() == 0

    refused = subprocess.run(
        [sys.executable, "-P", "-m", "gms.broker", "--listen", "127.0.0.1:0", "--store-dir", str(tmp_path / "store"),
         "--name", "another"],
        capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1
    assert f"is broker {first['name']!r}'s, not 'another': leave out --name" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
