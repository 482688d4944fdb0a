"""gms._recordcheck (the C record walk, CRC and envelope checks, views) against plain-Python
references: zlib for the CRC, a struct-based walk and check written the obvious way."""

import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gms import record as rec
from gms.record import _recordcheck


@given(st.binary(max_size=3000), st.integers(0, 15))
def test_crc32_is_zlibs(data, skip):
    view = memoryview(data)[min(skip, len(data)):]
    assert _recordcheck.crc32(view) == zlib.crc32(view)


def test_both_crc_kernels_agree_with_zlib():
    """The folding kernel (x86-64 with PCLMULQDQ) and the table kernel every machine has: every
    length across the folding thresholds (16-byte blocks, 64-byte start) and alignment."""
    probe = (
        "import os, sys, zlib\n"
        "from gms.record import _recordcheck as r\n"
        "data = os.urandom(5000)\n"
        "for n in [*range(300), 1000, 4095, 4096, 4097]:\n"
        "    for skip in range(8):\n"
        "        view = memoryview(data)[skip: skip + n]\n"
        "        assert r.crc32(view) == zlib.crc32(view), (n, skip)\n"
        "        batch = r.BatchCore(0)\n"
        "        batch.add(n + 12, 0x1234567, b'', view)\n"
        "        assert batch.seal()[8:12] == zlib.crc32(view, 0x1234567).to_bytes(4, 'big'), (n, skip)\n"
        "print(r.KERNEL)\n"
    )
    kernels = set()
    for kernel in ("", "table"):
        env = {**os.environ, "GMS_CRC_KERNEL": kernel}
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        kernels.add(out.stdout.strip())
    assert "table" in kernels


def _stored(messages: list[tuple[int, bytes]], base_offset: int = 0, queue_id: int = 0) -> tuple[bytearray, list[int]]:
    """Records as a store writes them (envelope stamped), back to back; and their starts."""
    buf, starts = bytearray(), []
    for i, (pad, body) in enumerate(messages):
        raw = bytearray(rec.encode_record(topic="t", body=body, tag="x" * pad))
        rec.write_broker_fields(raw, 0, queue_id, i, base_offset + len(buf), 1)
        starts.append(len(buf))
        buf += raw
    return buf, starts


def _reference_walk(buf: bytes, pos: int, end: int, max_records: int, verify_crc: bool):
    starts: list[int] = []
    while len(starts) < max_records and end - pos >= 12:
        size, magic, crc = struct.unpack_from(">iII", buf, pos)
        if magic != rec.MAGIC_V1 or size < rec.HEADER_SIZE or size > end - pos:
            break
        if verify_crc and zlib.crc32(buf[pos + rec.OFF_CRC_START: pos + size]) != crc:
            return np.array(starts, np.int64).tobytes(), pos, True
        starts.append(pos)
        pos += size
    return np.array(starts, np.int64).tobytes(), pos, False


records = st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=300)), min_size=1, max_size=12)
flips = st.lists(st.integers(0, 1 << 20), max_size=3)


@settings(max_examples=300)
@given(records, flips, st.integers(1, 20), st.booleans(), st.integers(0, 200))
def test_walk_matches_reference(messages, flip_at, max_records, verify_crc, cut):
    buf, _ = _stored(messages)
    for at in flip_at:
        buf[at % len(buf)] ^= 1 << (at % 8)
    end = max(len(buf) - cut, 0)
    data = bytes(buf)
    assert _recordcheck.walk(data, 0, end, max_records, verify_crc) == _reference_walk(
        data, 0, end, max_records, verify_crc)


@settings(max_examples=200)
@given(records, st.integers(0, 1 << 20), st.lists(st.integers(0, 30), min_size=1))
def test_crc_mismatches_matches_zlib(messages, flip_at, picks):
    buf, starts = _stored(messages)
    buf[flip_at % len(buf)] ^= 1 << (flip_at % 8)
    sizes = np.diff([*starts, len(buf)])
    chosen = [p % len(starts) for p in picks]  # any order, repeats, records far apart
    expected = [i for i, k in enumerate(chosen) if zlib.crc32(buf[starts[k] + rec.OFF_CRC_START: starts[k] + sizes[k]])
                != struct.unpack_from(">I", buf, starts[k] + rec.OFF_CRC)[0]]
    got = rec.crc_mismatches(bytes(buf), np.array(starts)[chosen], sizes[chosen])
    assert got.tolist() == expected


@settings(max_examples=300)
@given(records, flips, st.integers(0, 3), st.integers(0, 1 << 40))
def test_check_stored_matches_reference(messages, flip_at, lost_every, base_offset):
    queue_id = 5
    buf, starts = _stored(messages, base_offset, queue_id)
    for at in flip_at:
        buf[at % len(buf)] ^= 1 << (at % 8)
    sizes = [len(rec.encode_record(topic="t", body=body, tag="x" * pad)) for pad, body in messages]
    if lost_every:
        sizes = [1 if i % (lost_every + 1) == lost_every else s for i, s in enumerate(sizes)]
    offsets = list(range(len(messages)))
    damaged, misplaced = [], []
    for i, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        if size < rec.HEADER_SIZE:
            damaged.append(i)
            continue
        total, magic, crc, qid, qoff, phys = struct.unpack_from(">iIIiqq", buf, start)
        if zlib.crc32(buf[start + rec.OFF_CRC_START: start + size]) != crc:
            damaged.append(i)
        elif (total, magic, qid, qoff, phys) != (size, rec.MAGIC_V1, queue_id, offsets[i], base_offset + start):
            misplaced.append(i)
    got = rec.check_stored(bytes(buf), np.array(starts), np.array(sizes), base_offset, queue_id, np.array(offsets))
    assert (got.damaged.tolist(), got.misplaced.tolist()) == (damaged, misplaced)


def test_slices_are_the_records():
    buf, starts = _stored([(1, b"a"), (2, b"bb" * 50), (0, b"")])
    sizes = np.diff([*starts, len(buf)])
    view = memoryview(bytes(buf))
    views = rec.record_views(view, np.array(starts), sizes)
    assert [bytes(v) for v in views] == [bytes(view[s: s + n]) for s, n in zip(starts, sizes, strict=True)]
    assert all(v.obj is view.obj for v in views)  # zero-copy: the records keep the buffer alive


@pytest.mark.parametrize("starts, sizes", [([-1], [100]), ([0], [10_000]), ([50], [200])])
def test_records_outside_the_buffer_are_refused(starts, sizes):
    buf = bytes(200)
    with pytest.raises(ValueError, match="not inside"):
        _recordcheck.check_stored(buf, np.array(starts), np.array(sizes), 0, 0, np.zeros(1, np.int64))


@given(st.binary(max_size=3000), st.binary(max_size=80), st.integers(0, 2**32 - 1), st.integers(0, 2**31 - 1))
def test_batch_add_is_pack_and_zlib(body, shape, shape_crc, total):
    batch = _recordcheck.BatchCore(5)
    batch.add(7, 0, b"s", b"b")
    batch.add(total, shape_crc, shape, body)
    sealed = batch.seal()
    assert sealed[14:] == struct.pack(">iII", total, rec.MAGIC_V1, zlib.crc32(body, shape_crc)) + shape + body
    assert sealed[:14] == struct.pack(">iII", 7, rec.MAGIC_V1, zlib.crc32(b"b", 0)) + b"sb"
    assert type(sealed) is bytearray and sealed is not batch.seal()  # a copy each, the batch unchanged
    assert (batch.count, batch.size_bytes, batch.queue_id) == (2, 7 + total, 5)


def test_bad_arguments_raise_not_crash():
    batch = _recordcheck.BatchCore(0)
    with pytest.raises(ValueError):
        batch.add(2**31, 0, b"", b"")
    with pytest.raises(OverflowError):
        batch.add(10, -1, b"", b"")
    with pytest.raises(TypeError):
        batch.add(10, 0, b"", "text")  # a body must be a buffer
    with pytest.raises(TypeError):
        batch.add(10, 0, b"")
    with pytest.raises(TypeError):
        _recordcheck.BatchCore("queue")
    assert (batch.count, batch.size_bytes, batch.seal()) == (0, 0, bytearray())  # nothing half-added
    buf = bytes(200)
    with pytest.raises(TypeError, match="int64"):
        _recordcheck.check_stored(buf, np.zeros(1, np.int32), np.array([80]), 0, 0, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="differ in length"):
        _recordcheck.check_stored(buf, np.zeros(2, np.int64), np.array([80]), 0, 0, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="differ in length"):
        _recordcheck.slices(memoryview(buf), np.zeros(2, np.int64), np.array([80]))
    with pytest.raises(ValueError, match="not a range"):
        _recordcheck.walk(buf, 10, 300, 5, True)
    with pytest.raises(TypeError):
        _recordcheck.slices(buf, np.zeros(1, np.int64), np.ones(1, np.int64))  # a view, not bytes


@settings(max_examples=300)
@given(st.lists(st.integers(-3, 12), max_size=200), st.lists(st.integers(-3, 12), max_size=12, unique=True),
       st.integers(0, 60))
def test_pick_tags_is_isin_up_to_max_picks(hashes, wanted, max_picks):
    """The consumeQueue scan of a tag filter: numpy's isin, cut after max_picks; the scan stops
    one past the last pick then (few wanted hashes are compared one by one, many searched)."""
    from gms.broker.consumequeue.consume_queue import CQ_DTYPE, pick_tags

    entries = np.zeros(len(hashes), CQ_DTYPE)
    entries["tag_hash"] = hashes
    entries["phys"] = -1  # bytes around the hash that must not be read as one
    expected = np.flatnonzero(np.isin(np.array(hashes, np.int64), np.array(wanted, np.int64)))
    picked, scanned = pick_tags(entries, np.array(wanted, np.int64), max_picks)
    assert picked.tolist() == expected[:max_picks].tolist()
    assert scanned == (int(expected[max_picks - 1]) + 1 if 0 < max_picks <= len(expected) else
                       0 if max_picks == 0 else len(hashes))


@given(st.lists(st.sampled_from([0, 1, 100, 65535, 65536, 200_000]), min_size=1, max_size=6), st.data())
def test_batch_seals_small_bodies_copied_and_large_ones_kept_in_order(lengths, data):
    """Bodies under 64 KiB are copied into the batch, larger ones kept and put in place when sealed:
    either way seal gives the records back to back, any byte range of them, and where each ends."""
    batch = _recordcheck.BatchCore(1)
    expected = bytearray()
    ends = []
    for i, length in enumerate(lengths):
        shape, body = b"shape-%d" % i, bytearray(os.urandom(length))
        batch.add(12 + len(shape) + length, 0, shape, body)
        expected += struct.pack(">iII", 12 + len(shape) + length, rec.MAGIC_V1, zlib.crc32(body)) + shape + body
        ends.append(len(expected))
    assert batch.seal() == expected
    assert np.frombuffer(batch.record_ends(), np.int64).tolist() == ends
    start = data.draw(st.integers(0, len(expected)))
    stop = data.draw(st.integers(start, len(expected)))
    assert batch.seal(start, stop) == expected[start:stop]
    with pytest.raises(ValueError):
        batch.seal(0, len(expected) + 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"", b"a", b"ab", b"abc", b"b", b"ba", b"orders", b"ordert"]), max_size=60),
       st.integers(0, 8))
def test_group_bytes_groups_rows_by_their_bytes_whatever_their_order(names, gap):
    """Runs of equal rows (a send of many topics' batches) and rows in any order group alike:
    one entry per distinct name, each row indexing its own."""
    from gms.record.batch import group_bytes

    buf, offsets = bytearray(), []
    for name in names:
        buf += b"\xff" * gap  # bytes between the rows that must not count
        offsets.append(len(buf))
        buf += name
    arr = np.frombuffer(bytes(buf) or b"\0", np.uint8)
    lengths = np.array([len(name) for name in names], np.uint8)
    distinct, index = group_bytes(arr, np.array(offsets, np.int64), lengths)
    assert [distinct[i] for i in index] == names
    assert len(distinct) == len(set(distinct)) and (not names or set(distinct) == set(names))


def test_group_bytes_refuses_a_row_past_the_end_as_a_corrupt_record():
    from gms.record.batch import group_bytes
    from gms.store_errors import CorruptRecord

    arr = np.frombuffer(b"abcabc", np.uint8)
    with pytest.raises(CorruptRecord, match="past the end"):
        group_bytes(arr, np.array([0, 3], np.int64), np.array([3, 4], np.uint8))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 3, 100, 70_000]), st.booleans()), min_size=1, max_size=5), st.data())
def test_a_batch_sealed_with_a_stamp_is_the_body_stamped_after_sealing(records, data):
    """seal(stamp=...) puts the producer sequence in the first record of the body in the one copy
    it makes, byte for byte as stamp_sequence inserts it into a sealed body: the first record of
    any record range, large bodies (kept, not copied) included."""
    from gms.record.builder import BatchBuilder, RecordEncoder
    from gms.record.sequence import BatchSequence, read_sequence, stamp_sequence

    encoder, batch = RecordEncoder("127.0.0.1:1"), BatchBuilder(2)
    for i, (length, with_properties) in enumerate(records):
        encoder.add(batch, "orders", os.urandom(length), "tag", keys=("k",) if i % 2 else (),
                    properties={"p": "v" * i} if with_properties else None)
    ends = [0, *np.frombuffer(batch.record_ends(), np.int64).tolist()]
    first = data.draw(st.integers(0, len(records) - 1))
    last = data.draw(st.integers(first + 1, len(records)))
    sequence = BatchSequence(data.draw(st.integers(0, (1 << 63) - 1)), 3, 9, last - first)
    expected = batch.seal(ends[first], ends[last])
    stamp_sequence(expected, sequence)
    stamped = batch.seal(ends[first], ends[last], stamp=sequence.stamp())
    assert stamped == expected
    assert read_sequence(stamped) == sequence
    assert [r.body for r in rec.iter_records(bytes(stamped))] == [r.body for r in rec.iter_records(
        bytes(batch.seal(ends[first], ends[last])))]  # every CRC holds


def test_a_stamp_that_leaves_no_room_or_no_record_is_refused():
    from gms.record.builder import BatchBuilder, RecordEncoder
    from gms.record.sequence import BatchSequence

    encoder, batch = RecordEncoder(), BatchBuilder(0)
    encoder.add(batch, "orders", b"body", properties={"p": "v" * (rec.PROPS_BYTES_MAX - 10)})
    stamp = BatchSequence(1, 0, 0, 1).stamp()
    with pytest.raises(ValueError, match="no room for the producer sequence"):
        batch.seal(stamp=stamp)
    with pytest.raises(ValueError, match="no record to stamp"):
        batch.seal(0, 10, stamp=stamp)
    assert len(batch.seal()) == batch.size_bytes  # refusing changed nothing


ARENA_PROBE = """
import struct, sys, zlib
from gms.record import MAGIC_V1, _recordcheck

def record(shape, body):
    return struct.pack(">iII", 12 + len(shape) + len(body), MAGIC_V1, zlib.crc32(body)) + shape + body

def fill(batches, expected, body_len, rounds):
    for round_ in range(rounds):  # in turn, as a producer over many topics: every buffer grows
        for key, batch in batches.items():
            shape, body = b"%d/%d" % (key, round_), bytes([(key * 31 + round_) % 251]) * body_len
            batch.add(12 + len(shape) + body_len, 0, shape, body)
            expected[key] += record(shape, body)

def check(batches, expected):
    for key, batch in batches.items():
        assert batch.seal() == expected[key], key

batches = {key: _recordcheck.BatchCore(0) for key in range(300)}
expected = {key: bytearray() for key in batches}
fill(batches, expected, 100, 300)  # 256 B to 64 KiB each
check(batches, expected)
for key in range(0, 300, 2):  # answered: their blocks go to the next batches
    batches.pop(key).release()
    del expected[key]
for key in range(300, 450):
    batches[key], expected[key] = _recordcheck.BatchCore(0), bytearray()
fill(batches, expected, 100, 300)  # no block is any two batches' at once
check(batches, expected)
big = {key: _recordcheck.BatchCore(0) for key in range(1000, 1150)}  # 150 x 2 MiB: past the arena's 256
big_expected = {key: bytearray() for key in big}
fill(big, big_expected, 60_000, 34)
check(big, big_expected)
fill(big, big_expected, 60_000, 40)  # past 2 MiB: from the arena's blocks to malloc's
check(big, big_expected)
check(batches, expected)
print("ok")
"""


def test_batch_buffers_come_from_the_arena_and_back_and_past_it_from_malloc_never_shared():
    """Batch buffers are blocks of a huge-page arena, given back when a batch is answered or
    freed and taken by the next ones; batches past 2 MiB, or past the arena's 256 MiB, take
    malloc's. Filled in turn, every batch seals to its own records, whichever way it grew."""
    out = subprocess.run([sys.executable, "-c", ARENA_PROBE], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
