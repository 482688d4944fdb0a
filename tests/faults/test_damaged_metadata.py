"""A damaged metadata file under store/: derived ones are rebuilt or ignored, the others stop the
broker with one clear error naming the file (docs/operations.md, 'Damaged store files')."""

from __future__ import annotations

from pathlib import Path

import pytest
from processes import BrokerProcess

from gms.client import Admin, Consumer, Producer, ProducerRecord

DERIVED = ["checkpoint", "config/timers.json", "config/producers.snapshot"]
REFUSED = {"config/topics.json": "the topic table", "config/layout.json": "the store layout",
           "config/consumer_offsets.json": "the consumer offsets file"}


@pytest.fixture(scope="module")
def stopped_broker(tmp_path_factory: pytest.TempPathFactory) -> BrokerProcess:
    """A broker stopped cleanly after storing keyed messages and a group's committed offsets."""
    broker = BrokerProcess(tmp_path_factory.mktemp("damaged") / "broker", []).start()
    try:
        with Admin([broker.address]) as admin:
            admin.create_topic("t", queues=2)
        with Producer([broker.address]) as producer:
            producer.send_batch([ProducerRecord("t", b"m%d" % i, keys=[f"k{i}"]) for i in range(20)])
        with Consumer([broker.address], group="g", subscription={"t": "*"}, start_from="first") as consumer:
            read = 0
            while read < 20:
                read += len(consumer.poll(2000))
            consumer.commit()
    finally:
        broker.stop()
    return broker


def damage(path: Path) -> bytes:
    original = path.read_bytes()
    path.write_bytes(bytes([original[0] ^ 0x20]) + original[1:])  # '{' becomes '['
    return original


@pytest.mark.parametrize("name", DERIVED)
def test_a_derived_file_is_ignored_and_the_broker_serves(stopped_broker: BrokerProcess, name: str) -> None:
    path = stopped_broker.store_dir / "store" / name
    original = damage(path)
    try:
        stopped_broker.restart()
        group = f"g-{name}"  # a new group each time: it reads everything
        with Consumer([stopped_broker.address], group=group, subscription={"t": "*"}, start_from="first") as consumer:
            read = 0
            for _ in range(20):
                read += len(consumer.poll(1000))
                if read >= 20:
                    break
        assert read == 20
    finally:
        stopped_broker.stop()
        path.write_bytes(original)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_essential_file_stops_the_start_with_a_clear_error(stopped_broker: BrokerProcess, name: str) -> None:
    path = stopped_broker.store_dir / "store" / name
    original = damage(path)
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            stopped_broker.restart()
        tail = stopped_broker.log_tail()
        assert f"cannot start: {REFUSED[name]} {path} is damaged" in tail
        assert "Traceback" not in tail.rpartition("cannot start")[2]
    finally:
        path.write_bytes(original)
    stopped_broker.restart()  # the file restored, it starts as before
    stopped_broker.stop()
