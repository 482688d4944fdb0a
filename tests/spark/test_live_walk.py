"""The walk of a live pull's body (gms.spark_jobs.live_scan._walk): records by their length fields,
in C, stepping over a record whose magic is bad (its checks report it) and stopping where a
length makes no sense (nothing after it can be found)."""

from __future__ import annotations

import struct

from gms.record import OFF_MAGIC, encode_record
from gms.spark_jobs.live_scan import _walk


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
