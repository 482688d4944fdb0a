"""Bit flips and torn tails in a real broker's commitlog (issue 11, parts 2 and 3).

A flipped bit in the body of an old record, then SIGKILL: recovery keeps every other record
(it used to truncate the commitlog there), the damaged one is never served as data, consumers
pass it (SDK callback / ``damaged="raise"`` / a ``gms tail`` line), and sends after recovery
get fresh offsets that survive the next SIGKILL. A torn tail is still cut off.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, DamagedRecord, DamagedRecordError, Producer, ProducerRecord, Sql
from gms.record import decode_record, scan_records

TOPIC = "bitflip"
SENT = 2000
VICTIM = 100  # queue offset of the record whose body gets a flipped bit
CONSUME_TIMEOUT_S = 30.0
# No checkpoint after the first: crash recovery rescans every record written (the flipped one too).
BROKER_TOML = "[store]\ncheckpoint_interval_ms = 3600000\n"


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path).start(nameservers=1, brokers=0)
    try:
        config = tmp_path / "broker.toml"
        config.write_text(BROKER_TOML)
        running.add_broker("--flush", "sync", "--config", str(config))
        running.wait_registered(1)
        with Admin(nameserver=running.nameserver) as admin:
            admin.create_topic(TOPIC, 1)
        yield running
    finally:
        running.stop()


def send(cluster: LocalCluster, bodies: list[bytes]) -> list[int]:
    with Producer(nameserver=cluster.nameserver) as producer:
        results = producer.send_batch([ProducerRecord(TOPIC, body) for body in bodies])
    return [r.queue_offset for r in results]


def crash_and_restart(cluster: LocalCluster, damage=None) -> None:
    broker = cluster.brokers[0]
    broker.kill()
    if damage is not None:
        damage(broker.store_dir / "store" / "commitlog")
    broker.restart()
    cluster.wait_registered(1)


def records(commitlog: Path) -> list[tuple[Path, int, int, int]]:
    """(file, position, size, queue offset) of every record of TOPIC, in commitlog order."""
    found = []
    for path in sorted(commitlog.iterdir()):
        data = path.read_bytes()
        for start in scan_records(data).starts:
            record = decode_record(data, start)
            if record.topic == TOPIC:
                found.append((path, start, record.total_size, record.queue_offset))
    return found


def flip_body_bit(queue_offset: int):
    def damage(commitlog: Path) -> None:
        path, pos, size, _ = next(r for r in records(commitlog) if r[3] == queue_offset)
        with open(path, "r+b") as fh:
            fh.seek(pos + size - 2)  # in the body: the framing stays intact
            byte = fh.read(1)[0]
            fh.seek(pos + size - 2)
            fh.write(bytes([byte ^ 0x10]))
    return damage


def flip_value_bit(queue_offset: int, value: bytes):
    """Flip bit 0x10 of the first byte of a property value of the record (``u`` becomes ``e``)."""
    def damage(commitlog: Path) -> None:
        path, pos, size, _ = next(r for r in records(commitlog) if r[3] == queue_offset)
        at = pos + path.read_bytes()[pos: pos + size].index(b"\x01" + value + b"\x02") + 1
        with open(path, "r+b") as fh:
            fh.seek(at)
            fh.write(bytes([value[0] ^ 0x10]))
    return damage


def tear_last_record(commitlog: Path) -> None:
    path, pos, size, _ = records(commitlog)[-1]
    with open(path, "r+b") as fh:  # only the first part of the record reached the disk
        fh.seek(pos + 40)
        fh.write(bytes(size - 40))


def consume(cluster: LocalCluster, expected: int, subscription: str | Sql = "*",
            **options) -> tuple[list[tuple[int, bytes]], list[DamagedRecord]]:
    """(offset, body) of every message from the first, and the damaged records passed."""
    damaged: list[DamagedRecord] = []
    got: list[tuple[int, bytes]] = []
    with Consumer(nameserver=cluster.nameserver, group=f"g{time.monotonic_ns()}", subscription={TOPIC: subscription},
                  start_from="first", on_damaged=damaged.append, **options) as consumer:
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            got.extend((m.queue_offset, m.body) for m in consumer.poll(200))
        assert consumer.damaged_count == len(damaged)
    return got, damaged


def body(i: int) -> bytes:
    return b"acked-%05d" % i


def fill(cluster: LocalCluster) -> None:
    """Send SENT messages; the first alone, so the store's only checkpoint (written at its first
    flush) is behind the rest and crash recovery scans them."""
    assert send(cluster, [body(0)]) == [0]
    assert send(cluster, [body(i) for i in range(1, SENT)]) == list(range(1, SENT))


def test_bitflip_in_an_old_record_costs_that_record_alone(cluster):
    fill(cluster)
    crash_and_restart(cluster, flip_body_bit(VICTIM))
    intact = [(i, body(i)) for i in range(SENT) if i != VICTIM]

    got, damaged = consume(cluster, len(intact))
    assert got == intact  # nothing after the damaged record was lost, the damaged one not served
    assert [d.queue_offset for d in damaged] == [VICTIM]
    assert damaged[0].topic == TOPIC and damaged[0].queue_id == 0

    # New sends after recovery get fresh offsets, and they survive the next crash.
    assert send(cluster, [body(i) for i in range(SENT, SENT + 50)]) == list(range(SENT, SENT + 50))
    crash_and_restart(cluster)
    intact += [(i, body(i)) for i in range(SENT, SENT + 50)]
    got, damaged = consume(cluster, len(intact))
    assert got == intact
    assert [d.queue_offset for d in damaged] == [VICTIM]


def test_consumers_pass_a_damaged_record_raise_and_tail(cluster):
    fill(cluster)
    crash_and_restart(cluster, flip_body_bit(VICTIM))
    intact = [(i, body(i)) for i in range(SENT) if i != VICTIM]

    # damaged="raise": the messages before it first, then the error, then the rest.
    raised: list[DamagedRecord] = []
    got: list[tuple[int, bytes]] = []
    with Consumer(nameserver=cluster.nameserver, group="raiser", subscription={TOPIC: "*"},
                  start_from="first", damaged="raise") as consumer:
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(got) < len(intact) and time.monotonic() < deadline:
            try:
                got.extend((m.queue_offset, m.body) for m in consumer.poll(200))
            except DamagedRecordError as err:
                assert got == intact[:VICTIM]
                raised.append(err.record)
    assert got == intact
    assert [d.queue_offset for d in raised] == [VICTIM]

    # gms tail prints a line for it, and every intact message.
    tail = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "tail", TOPIC, "--nameserver", cluster.nameserver],
                          capture_output=True, timeout=60, check=False, text=True)
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert f"{TOPIC}/0@{VICTIM}  DAMAGED" in "\n".join(lines)
    assert len([line for line in lines if "DAMAGED" in line]) == 1
    assert len([line for line in lines if "acked-" in line]) == len(intact)


@pytest.mark.parametrize("subscription", [Sql("region = 'eu'"), "eu"], ids=["sql", "tag"])
def test_filtered_reads_never_serve_a_damaged_record(cluster, subscription):
    """Bits flipped under the running broker (no recovery sees them): the body of a message the
    filter selects, and a property value of one it does not ('uu' made 'eu'). A filtered read
    checks the CRC of what it reads before filtering: neither is served, the SQL read (which reads
    both) passes both as damaged, the tag read (which reads only entries of its tag) the first."""
    regions = ["eu" if i % 10 == 0 else "uu" for i in range(SENT)]
    with Producer(nameserver=cluster.nameserver) as producer:
        producer.send_batch([ProducerRecord(TOPIC, body(i), tag=regions[i], properties={"region": regions[i]})
                             for i in range(SENT)])
    commitlog = cluster.brokers[0].store_dir / "store" / "commitlog"
    flip_value_bit(VICTIM + 1, b"uu")(commitlog)  # first: the scan that finds records stops at damage
    flip_body_bit(VICTIM)(commitlog)
    expected = [(i, body(i)) for i in range(SENT) if regions[i] == "eu" and i != VICTIM]

    got, damaged = consume(cluster, len(expected), subscription)
    assert got == expected
    assert [d.queue_offset for d in damaged] == ([VICTIM, VICTIM + 1] if isinstance(subscription, Sql) else [VICTIM])


def test_torn_tail_is_still_truncated(cluster):
    fill(cluster)
    crash_and_restart(cluster, tear_last_record)
    got, damaged = consume(cluster, SENT - 1)
    assert got == [(i, body(i)) for i in range(SENT - 1)] and damaged == []
    # The torn record's offset is the next one given out; later sends survive another crash.
    assert send(cluster, [body(i) for i in range(SENT, SENT + 10)]) == list(range(SENT - 1, SENT + 9))
    crash_and_restart(cluster)
    got, _ = consume(cluster, SENT + 9)
    assert [b for _, b in got] == [body(i) for i in range(SENT - 1)] + [body(i) for i in range(SENT, SENT + 10)]


def test_spark_live_read_reports_damaged_records(broker):
    pytest.importorskip("pyspark")
    from gms.spark_jobs.live_scan import read_live_range
    from gms.spark_jobs.options import parse_options
    from gms.spark_jobs.partitions import QueueRange
    from gms.spark_jobs.schema import arrow_schema

    with Admin(brokers=broker.address) as admin:
        admin.create_topic(TOPIC, 1)
    with Producer(brokers=broker.address) as producer:
        producer.send_batch([ProducerRecord(TOPIC, body(i)) for i in range(200)])
    flip_body_bit(VICTIM)(broker.store_dir / "store" / "commitlog")  # under the running broker's map
    reported: list[tuple[int, int]] = []
    options = parse_options({"brokers": broker.address, "topics": TOPIC})
    batches = read_live_range(QueueRange(TOPIC, 0, 0, 200, broker.address), options, arrow_schema(options.columns),
                              lambda topic, queue_id, offsets, phys: reported.extend(zip(offsets.tolist(),
                                                                                         phys.tolist(), strict=True)))
    offsets = [o for batch in batches for o in batch.column("queue_offset").to_pylist()]
    assert offsets == [i for i in range(200) if i != VICTIM]
    assert [q for q, _ in reported] == [VICTIM]
