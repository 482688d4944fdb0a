"""get_many, the read of many queues in one call (a consumer's FETCH), answers what ``get`` of
each queue in turn answers within the total byte budget: over random queues, offsets, limits and
budgets of a real store holding hidden (scheduled) entries, damaged records (a bit flipped in a
commitlog file), a header to repair, expired offsets, and records across commitlog and
consumeQueue files."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import small_config

from gms.broker.store import GetResult, GetStatus, MessageStore, QueueGet
from gms.broker.store.topic_table import TopicLimits
from gms.record import OFF_PHYS_OFFSET, OFF_QUEUE_OFFSET, Message, encode_batch, encode_record
from gms.record.layout import DELIVER_AT_PROPERTY, FLAG_SCHEDULED
from gms.store_errors import StoreError, UnknownTopic

QUEUES = {"a": 3, "b": 2, "short": 2}


def _flip(store: MessageStore, store_dir: Path, topic: str, queue_id: int, offset: int, at: int | None = None) -> None:
    """Flip a bit of a record's byte ``at`` (default: its last, in its body), in its commitlog file."""
    record = store.read_entry(topic, queue_id, offset)
    phys = struct.unpack_from(">q", record, OFF_PHYS_OFFSET)[0]
    files = sorted((store_dir / "commitlog").iterdir(), key=lambda p: int(p.name))
    path = next(p for p in reversed(files) if int(p.name) <= phys)
    with open(path, "r+b") as f:
        f.seek(phys - int(path.name) + (len(record) - 1 if at is None else at))
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Iterator[tuple[MessageStore, dict[tuple[str, int], int], Path]]:
    """A store of topics "a", "b" and "short" (its records expired), random records interleaved."""
    store_dir = tmp_path_factory.mktemp("get-many") / "store"
    store = MessageStore.open(store_dir, small_config())
    for topic, count in QUEUES.items():
        store.create_topic(topic, count, TopicLimits(retention_ms=1000) if topic == "short" else None)
    rng = random.Random(7)
    for _ in range(400):
        topic = rng.choice(["a", "a", "b", "short"])
        queue_id = rng.randrange(QUEUES[topic])
        if (topic, queue_id) in (("a", 0), ("b", 1)) and rng.random() < 0.3:  # hidden until due
            store.append(encode_record(topic=topic, body=b"later", queue_id=queue_id, flags=FLAG_SCHEDULED,
                                       properties={DELIVER_AT_PROPERTY: str(int(time.time() * 1000) + 3_600_000)}))
            continue
        store.append(encode_batch([Message(topic, b"x" * rng.randrange(1, 400), queue_id=queue_id)
                                   for _ in range(rng.randrange(1, 6))]))
    store.delete_expired(now_ms=int(time.time() * 1000) + 60_000)  # "short" keeps none of its records
    assert store.min_offset("short", 0) == store.max_offset("short", 0) > 0
    for offset in (2, 9):  # damaged bodies: their CRCs fail
        _flip(store, store_dir, "a", 1, offset)
    _flip(store, store_dir, "b", 0, 3, OFF_QUEUE_OFFSET + 7)  # outside the CRC: repaired by a read
    ends = {(topic, q): store.max_offset(topic, q) for topic, count in QUEUES.items() for q in range(count)}
    yield store, ends, store_dir
    store.close()


def one_by_one(store: MessageStore, queues: list[QueueGet], max_msgs: int, max_bytes: int,
               total: int) -> list[GetResult | StoreError]:
    """What get_many answers, read with ``get`` queue after queue (as FETCH did)."""
    found: list[GetResult | StoreError] = []
    for topic, queue_id, offset, limit in queues:
        if total <= 0:
            break
        try:
            result = store.get(topic, queue_id, offset, max_msgs, min(max_bytes, total), read_limit=limit,
                               coalesce=True)
        except StoreError as err:
            found.append(err)
            continue
        found.append(result)
        total -= sum(view.nbytes for view in result.records)
    return found


def _comparable(result: GetResult | StoreError) -> tuple:
    if isinstance(result, StoreError):
        return type(result), str(result)
    return (result.status, result.next_offset, result.min_offset, result.max_offset, result.damaged,
            b"".join(result.records), None if result.offsets is None else result.offsets.tolist())


queue_gets = st.lists(st.tuples(st.sampled_from(["a", "b", "short", "none"]), st.integers(0, 3),
                                st.integers(-2, 250), st.one_of(st.none(), st.integers(0, 250))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(queues=queue_gets, max_msgs=st.integers(1, 40), max_bytes=st.integers(1, 3000),
       total=st.integers(1, 20_000))
def test_get_many_answers_what_get_answers_queue_after_queue(filled, queues, max_msgs, max_bytes, total):
    store, _, _ = filled
    wanted = [QueueGet(*q) for q in queues]
    expected = one_by_one(store, wanted, max_msgs, max_bytes, total)
    got = store.get_many(wanted, max_msgs, max_bytes, total)
    assert [_comparable(r) for r in got] == [_comparable(r) for r in expected]


def test_every_case_is_met(filled):
    """The store holds what the equivalence test is about: hidden entries, damage, expiry."""
    store, ends, store_dir = filled
    everything = [QueueGet(topic, q, 0) for topic, q in ends]
    found = dict(zip(ends, store.get_many(everything, 4096, 1 << 20, 1 << 30), strict=True))
    assert found["a", 1].damaged and [d[0] for d in found["a", 1].damaged] == [2, 9]
    assert store.damaged_records("a", 1) == [2, 9]
    assert found["short", 0].status is GetStatus.OFFSET_TOO_SMALL
    for key in (("a", 0), ("b", 1)):  # hidden entries skipped
        assert len(found[key].offsets) < ends[key]
    assert len(list((store_dir / "commitlog").iterdir())) > 3 and max(ends.values()) > 100  # files of each kind


def test_the_budget_stops_before_the_first_queue_reached_once_spent(filled):
    store, _, _ = filled
    queues = [QueueGet("a", 2, 0), QueueGet("b", 1, 0), QueueGet("none", 0, 0)]
    first = store.get("a", 2, 0, 10, coalesce=True)
    size = sum(view.nbytes for view in first.records)
    got = store.get_many(queues, 10, 1 << 20, size)
    assert len(got) == 1 and _comparable(got[0]) == _comparable(first)
    assert len(store.get_many(queues, 10, 1 << 20, size + 1)) == 2  # the second reads a record at least
    assert isinstance(store.get_many(queues, 10, 1 << 20, 1 << 30)[2], UnknownTopic)  # an error in its place


_FIRST_READ = """
import sys
from store_helpers import small_config
from gms.broker.store import MessageStore, QueueGet
from gms.record import Message, encode_batch

store = MessageStore.open(sys.argv[1], small_config())
store.create_topic("t", 2)
store.append(encode_batch([Message("t", b"x", queue_id=i % 2) for i in range(8)]))
loaded = set(sys.modules)
found = store.get_many([QueueGet("t", 0, 0, None), QueueGet("t", 1, 0, None)], 32, 1 << 20, 1 << 20)
assert [len(result.offsets) for result in found] == [4, 4], found
print(sorted(set(sys.modules) - loaded))
store.close()
"""


def test_a_first_read_imports_nothing(tmp_path):
    """A broker's first fetch does not wait for an import: np.unique imports numpy.ma on its first
    call (15-80 ms), so many_reads imports it with itself."""
    out = subprocess.run([sys.executable, "-c", _FIRST_READ, str(tmp_path / "store")], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parent, env={**os.environ, "PYTHONPATH": "."})
    assert out.stdout.strip() == "[]", out.stdout
