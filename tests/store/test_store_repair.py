"""Damaged records between replicas, at the store level: a leader's fetch read lists its damaged
records (CRC or lost) instead of sending their bytes, a follower indexes them as damaged with the
leader's offsets, and a follower's own damaged copy is rewritten in place from the leader's
intact one (``repair_record``), which refuses anything that is not that record."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from store_helpers import batch, small_config

from gms.broker.store import GetStatus, MessageStore, RepairOutcome, ReplicaGap
from gms.broker.store.paths import ABORT_FILE, CHECKPOINT_FILE
from gms.broker.store.types import LOST_ENTRY_SIZE
from gms.record import OFF_CRC_START, OFF_STORE_TS, OFF_TAG_HASH, decode_record, seal_crc
from gms.store_errors import CorruptRecord, InvalidRecord

FILE_SIZE = 1 << 20


def config():
    return small_config(commitlog_file_size_bytes=FILE_SIZE, checkpoint_interval_ms=3_600_000)


@pytest.fixture
def pair(tmp_path: Path):
    leader = MessageStore.open(tmp_path / "leader", config())
    follower = MessageStore.open(tmp_path / "follower", config())
    for s in (leader, follower):
        s.create_topic("t", 1)
    yield leader, follower
    for s in (leader, follower):
        s.close()


def flip(store: MessageStore, offset: int, delta: int = -1) -> int:
    """Flip a bit in the record at queue ``offset`` through its file (``delta`` from its start,
    negative from its end; the store's shared map sees it at once) once it is flushed (a fetch
    read checks only what may have been read back from the disk); returns its commitlog offset."""
    store.durable_future(store.stats().max_offset).result(10)
    view = store.get("t", 0, offset, 1).records[0]
    record = decode_record(bytes(view))
    phys, size = record.phys_offset, record.total_size
    base = phys - phys % FILE_SIZE
    with open(store.root / "commitlog" / f"{base:020d}", "r+b") as fh:
        pos = phys - base + (delta if delta >= 0 else size + delta)
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ 0x10]))
    return phys


def raw(store: MessageStore, phys: int, size: int) -> bytes:
    base = phys - phys % FILE_SIZE
    return (store.root / "commitlog" / f"{base:020d}").read_bytes()[phys - base: phys - base + size]


def bodies(store: MessageStore, offset: int = 0) -> dict[int, bytes]:
    """Queue offset -> body of every record served from ``offset`` (damaged ones left out)."""
    out: dict[int, bytes] = {}
    while True:
        got = store.get("t", 0, offset, 7)
        if got.status is not GetStatus.FOUND:
            return out
        for view in got.records:
            record = decode_record(bytes(view))  # checks the CRC
            out[record.queue_offset] = bytes(record.body)
        offset = got.next_offset


def damaged_offsets(store: MessageStore) -> list[int]:
    return [d[0] for d in store.get("t", 0, 0, 10_000).damaged]


def replicate(leader: MessageStore, follower: MessageStore, max_bytes: int = 1 << 20) -> None:
    """What the fetcher does: read_runs on the leader, append on the follower, until caught up."""
    while (offset := follower.max_offset("t", 0)) < leader.max_offset("t", 0):
        read = leader.read_runs("t", 0, offset, 1000, max_bytes)
        chunk = b"".join(read.views)
        assert read.size == len(chunk) == int(read.sizes.sum())
        assert len(read.sizes) + len(read.damaged) == read.next_offset - offset
        if len(read.damaged):
            follower.append_replicated_run("t", 0, offset, chunk, zlib.crc32(chunk), read.sizes, read.damaged)
        else:
            follower.append_replicated(chunk, zlib.crc32(chunk), read.sizes)


def test_read_runs_lists_damaged_records_instead_of_sending_them(pair):
    leader, _ = pair
    leader.append(batch(n=30))
    flip(leader, 7)
    read = leader.read_runs("t", 0, 0, 1000, 1 << 20)
    assert read.next_offset == 30 and read.damaged.tolist() == [7] and len(read.sizes) == 29
    sent = [decode_record(r) for r in _split(b"".join(read.views), read.sizes)]  # each CRC checked
    assert [r.queue_offset for r in sent] == [o for o in range(30) if o != 7]
    assert leader.damaged_records("t", 0) == [7]  # the read noted it


def _split(chunk: bytes, sizes: np.ndarray) -> list[bytes]:
    starts = np.concatenate(([0], np.cumsum(sizes)))
    return [chunk[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)]


@pytest.mark.parametrize("where", [[0], [5], [29], [3, 4, 5], [0, 29], list(range(30))])
def test_follower_indexes_the_leaders_damaged_records_as_damaged_with_its_offsets(pair, where):
    leader, follower = pair
    leader.append(batch(n=30))
    for offset in where:
        flip(leader, offset)
    replicate(leader, follower, max_bytes=500)  # several fetches: damage at a fetch's edges too
    assert follower.max_offset("t", 0) == 30
    assert damaged_offsets(follower) == damaged_offsets(leader) == where
    assert bodies(follower) == bodies(leader) and set(bodies(follower)) == set(range(30)) - set(where)
    assert follower.damaged_records("t", 0) == []  # lost entries: nothing could repair them
    # Sends keep continuing both queues after it, at the same offsets.
    leader.append(batch(n=3, start=30))
    replicate(leader, follower)
    assert bodies(follower) == bodies(leader) and follower.max_offset("t", 0) == 33


def test_lost_entries_travel_on_as_damaged(pair, tmp_path):
    """A follower that leads later sends its own lost entries on as damaged."""
    leader, follower = pair
    leader.append(batch(n=10))
    flip(leader, 4)
    replicate(leader, follower)
    third = MessageStore.open(tmp_path / "third", config())
    try:
        third.create_topic("t", 1)
        read = follower.read_runs("t", 0, 0, 1000, 1 << 20)
        assert read.damaged.tolist() == [4]
        replicate(follower, third)
        assert damaged_offsets(third) == [4] and bodies(third) == bodies(leader)
        assert third.get("t", 0, 4, 1).status is GetStatus.FOUND  # consumed past, not stuck
    finally:
        third.close()


def test_append_lost_must_continue_the_queue(pair):
    _, follower = pair
    follower.append(batch(n=3))
    with pytest.raises(ReplicaGap):
        follower.append_lost("t", 0, 4, 1)
    follower.append_lost("t", 0, 3, 2)
    assert follower.max_offset("t", 0) == 5 and damaged_offsets(follower) == [3, 4]
    assert follower.append(batch(n=1, start=5)).queue_offsets.tolist() == [5]
    assert sorted(bodies(follower)) == [0, 1, 2, 5]


def test_lost_entries_on_an_empty_queue_and_time_lookups(pair):
    _, follower = pair
    follower.append_lost("t", 0, 0, 2)
    assert follower.get("t", 0, 0, 10).damaged and follower.max_offset("t", 0) == 2
    follower.append(batch(n=2, start=2))
    assert sorted(bodies(follower)) == [2, 3]
    assert follower.offset_for_timestamp("t", 0, 0) == 0


def test_a_follower_crash_rebuilds_lost_entries_followed_by_records(pair, tmp_path):
    leader, follower = pair
    leader.append(batch(n=1))
    replicate(leader, follower)
    follower.close()  # a clean close's checkpoint: recovery scans from here
    checkpoint = (follower.root / CHECKPOINT_FILE).read_bytes()
    follower = MessageStore.open(follower.root, config())
    leader.append(batch(n=19, start=1))
    flip(leader, 10)
    flip(leader, 11)
    replicate(leader, follower)
    follower.close()
    (follower.root / CHECKPOINT_FILE).write_bytes(checkpoint)  # as a crash leaves them
    (follower.root / ABORT_FILE).write_bytes(b"")
    follower = MessageStore.open(follower.root, config())
    try:
        assert follower.max_offset("t", 0) == 20
        assert damaged_offsets(follower) == [10, 11]
        assert sorted(bodies(follower)) == [o for o in range(20) if o not in (10, 11)]
    finally:
        follower.close()  # the fixture closes the first instance again: a no-op


def test_repair_rewrites_a_damaged_copy_from_the_leaders(pair):
    leader, follower = pair
    leader.append(batch(n=20, tag="a"))
    replicate(leader, follower)
    phys = flip(follower, 9)
    assert damaged_offsets(follower) == [9] and follower.damaged_records("t", 0) == [9]
    copy = bytes(leader.get("t", 0, 9, 1).records[0])
    assert follower.repair_record("t", 0, 9, copy) is RepairOutcome.REPAIRED
    assert follower.damaged_records("t", 0) == [] and damaged_offsets(follower) == []
    assert bodies(follower) == bodies(leader)
    record = decode_record(bytes(follower.get("t", 0, 9, 1).records[0]))
    leaders = decode_record(copy)
    assert (record.phys_offset, record.queue_offset, record.queue_id) == (phys, 9, 0)
    assert record.store_ts_ms == leaders.store_ts_ms and record.body == leaders.body
    assert follower.get("t", 0, 0, 100, tag_hashes=frozenset([leaders.tag_hash])).records  # index intact
    assert follower.repair_record("t", 0, 9, copy) is RepairOutcome.INTACT  # nothing to do now


def test_repair_survives_a_crash(pair):
    leader, follower = pair
    leader.append(batch(n=1))
    replicate(leader, follower)
    follower.close()
    checkpoint = (follower.root / CHECKPOINT_FILE).read_bytes()
    follower = MessageStore.open(follower.root, config())
    try:
        leader.append(batch(n=10, start=1))
        replicate(leader, follower)
        assert follower.max_offset("t", 0) == 11
        flip(follower, 5)
        follower.close()
        (follower.root / CHECKPOINT_FILE).write_bytes(checkpoint)
        (follower.root / ABORT_FILE).write_bytes(b"")
        follower = MessageStore.open(follower.root, config())
        assert follower.recovered_damaged == 1
        assert follower.damaged_records("t", 0) == [5]  # found by recovery, before any read
        follower.repair_record("t", 0, 5, bytes(leader.get("t", 0, 5, 1).records[0]))
        assert follower.damaged_records("t", 0) == [] and damaged_offsets(follower) == []
        follower.close()
        (follower.root / ABORT_FILE).write_bytes(b"")  # a crash right after the repair
        follower = MessageStore.open(follower.root, config())
        assert follower.recovered_damaged == 0 and damaged_offsets(follower) == []
        assert sorted(bodies(follower)) == list(range(11))
    finally:
        follower.close()


def test_repair_of_a_flipped_tag_hash_indexed_by_recovery(pair):
    """A flip in the tag hash (CRC-covered) then a crash: recovery indexes the damaged record with
    the flipped hash; the leader's copy repairs the record and the index entry's hash."""
    leader, follower = pair
    leader.append(batch(n=1, tag="a"))
    replicate(leader, follower)
    follower.close()
    checkpoint = (follower.root / CHECKPOINT_FILE).read_bytes()
    follower = MessageStore.open(follower.root, config())
    try:
        leader.append(batch(n=5, start=1, tag="a"))
        replicate(leader, follower)
        flip(follower, 3, delta=OFF_TAG_HASH + 7)
        follower.close()
        (follower.root / CHECKPOINT_FILE).write_bytes(checkpoint)
        (follower.root / ABORT_FILE).write_bytes(b"")
        follower = MessageStore.open(follower.root, config())
        assert follower.damaged_records("t", 0) == [3]
        copy = bytes(leader.get("t", 0, 3, 1).records[0])
        assert follower.repair_record("t", 0, 3, copy) is RepairOutcome.REPAIRED
        tagged = follower.get("t", 0, 0, 100, tag_hashes=frozenset([decode_record(copy).tag_hash]))
        assert [decode_record(v).queue_offset for v in tagged.records] == list(range(6))
    finally:
        follower.close()


def test_repair_refuses_anything_but_an_intact_copy_of_that_record(pair):
    leader, follower = pair
    leader.append(batch(n=5, body=b"x"))
    leader.append(batch(n=1, body=b"longer body", start=5))
    replicate(leader, follower)
    good = bytes(leader.get("t", 0, 2, 1).records[0])
    phys = flip(follower, 2)
    before = raw(follower, phys, len(good))
    assert damaged_offsets(follower) == [2]  # a read finds it
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    with pytest.raises(CorruptRecord):
        follower.repair_record("t", 0, 2, bad_crc)
    with pytest.raises(InvalidRecord):  # another size: not this record
        follower.repair_record("t", 0, 2, bytes(leader.get("t", 0, 5, 1).records[0]))
    other = bytearray(good)
    other[HEADER_TOPIC:HEADER_TOPIC + 1] = b"u"  # another topic, its CRC sealed again
    seal_crc(other)
    with pytest.raises(InvalidRecord):
        follower.repair_record("t", 0, 2, other)
    with pytest.raises(InvalidRecord):
        follower.repair_record("t", 0, 99, good)
    assert raw(follower, phys, len(good)) == before  # nothing written
    assert follower.damaged_records("t", 0) == [2]
    follower.append_lost("t", 0, 6, 1)
    with pytest.raises(InvalidRecord, match="lost entry"):  # no room in the commitlog
        follower.repair_record("t", 0, 6, good)
    assert follower.get("t", 0, 6, 1).damaged[0][0] == 6
    assert follower.repair_record("t", 0, 2, good) is RepairOutcome.REPAIRED


def test_repair_of_a_damaged_store_time_keeps_the_leaders(pair):
    """The envelope lies outside the CRC: a flip there is repaired by reads; one in the producer
    bytes is what repair_record is for, and the store time comes with the copy."""
    leader, follower = pair
    leader.append(batch(n=3))
    replicate(leader, follower)
    flip(follower, 1, delta=OFF_CRC_START + 2)  # producer bytes: born time
    assert damaged_offsets(follower) == [1]
    copy = bytes(leader.get("t", 0, 1, 1).records[0])
    follower.repair_record("t", 0, 1, copy)
    view = follower.get("t", 0, 1, 1).records[0]
    assert bytes(view[OFF_STORE_TS:]) == copy[OFF_STORE_TS:]


HEADER_TOPIC = 76  # the topic's first byte (the fixed header's size)
assert LOST_ENTRY_SIZE == 1


def test_lost_entries_at_the_end_survive_a_crash_after_a_checkpoint(pair, caplog):
    """A checkpoint right after lost entries (the commitlog's end) keeps them: recovery, which
    cuts the index at entries pointing where it starts scanning, neither drops them nor has to
    rebuild every index to find them again."""
    leader, follower = pair
    leader.append(batch(n=10))
    flip(leader, 8)
    flip(leader, 9)
    replicate(leader, follower)  # 8 and 9 end the fetch: lost entries at the end of the follower's queue
    follower.close()  # its checkpoint: the commitlog's end, past every record
    checkpoint = (follower.root / CHECKPOINT_FILE).read_bytes()
    follower = MessageStore.open(follower.root, config())
    try:
        leader.append(batch(n=2, start=10))
        replicate(leader, follower)
        follower.close()
        (follower.root / CHECKPOINT_FILE).write_bytes(checkpoint)  # a crash after that checkpoint
        (follower.root / ABORT_FILE).write_bytes(b"")
        with caplog.at_level("WARNING"):
            follower = MessageStore.open(follower.root, config())
        assert "rebuilding every consumeQueue" not in caplog.text
        assert follower.max_offset("t", 0) == 12 and damaged_offsets(follower) == [8, 9]
        assert sorted(bodies(follower)) == [*range(8), 10, 11]
    finally:
        follower.close()
