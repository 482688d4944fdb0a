"""A live read's pulls: the walk of a pull's body (gms.spark_jobs.live_scan._walk) finds records
by their length fields, in C, stepping over a record whose magic is bad (its checks report it)
and stopping where a length makes no sense (nothing after it can be found); a range longer than
a pull comes from a real broker in batches of ``batchRecords``, every record once, in order."""

from __future__ import annotations

import struct

from gms.client import Admin, Producer
from gms.record import OFF_MAGIC, encode_record
from gms.spark_jobs.live_scan import PULL_RECORDS_MAX, _walk, read_live_range
from gms.spark_jobs.options import parse_options
from gms.spark_jobs.partitions import QueueRange
from gms.spark_jobs.schema import COLUMN_NAMES, arrow_schema


def _body() -> tuple[bytearray, list[int]]:
    records = [encode_record(topic="t", body=b"m%d" % i * (i + 1)) for i in range(4)]
    starts = [sum(map(len, records[:i])) for i in range(4)]
    return bytearray(b"".join(records)), starts


def test_every_record_is_found_and_a_bad_magic_is_stepped_over():
    body, starts = _body()
    struct.pack_into(">I", body, starts[1] + OFF_MAGIC, 0xDEADBEEF)
    found, sizes, walked = _walk(memoryview(body))
    assert found.tolist() == starts and walked == len(body)
    assert sizes.tolist() == [b - a for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


def test_a_broken_length_stops_the_walk_there():
    body, starts = _body()
    struct.pack_into(">i", body, starts[2], 3)  # shorter than a header
    found, sizes, walked = _walk(memoryview(body))
    assert found.tolist() == starts[:2] and walked == starts[2] and sizes.tolist() == [starts[1], starts[2] - starts[1]]
    struct.pack_into(">i", body, starts[2], len(body))  # past the end of the body
    assert _walk(memoryview(body))[2] == starts[2]


def test_a_range_longer_than_a_pull_comes_in_batches_of_batch_records(broker):
    count = 2 * PULL_RECORDS_MAX + 1000
    with Admin([broker.address]) as admin:
        admin.create_topic("long", queues=2)
    with Producer([broker.address]) as producer:
        for low in range(0, count, 2000):  # the other queue's records between them: a copy per pull
            producer.send_batch([{"topic": "long", "body": b"%d" % i, "queue": q}
                                 for i in range(low, min(low + 2000, count)) for q in (0, 1)])
    options = parse_options({"brokers": broker.address, "batchRecords": str(PULL_RECORDS_MAX + 1)})
    bad: list[object] = []
    batches = list(read_live_range(QueueRange("long", 0, 10, count, broker.address), options,
                                   arrow_schema(COLUMN_NAMES), lambda *args: bad.append(args)))
    assert [b.num_rows for b in batches] == [2 * PULL_RECORDS_MAX, count - 10 - 2 * PULL_RECORDS_MAX] and not bad
    offsets = [o for b in batches for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(10, count))
    assert [bytes(v) for b in batches for v in b.column("body").to_pylist()] == [b"%d" % i for i in range(10, count)]
