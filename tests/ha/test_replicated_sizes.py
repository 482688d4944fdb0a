"""A follower finds record starts from the record sizes its leader announces (read from the
leader's consumeQueue): wrong sizes are refused with nothing stored, right ones store exactly
what the leader has."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, decode_record, encode_batch
from gms.store_errors import CorruptRecord

CONFIG = {"commitlog_file_size_bytes": 1 << 20, "cq_entries_per_file": 64}
COUNT = 40  # more than one batch's worth of vectorised checks


@pytest.fixture
def stores(tmp_path):
    with MessageStore(tmp_path / "leader", StoreConfig(**CONFIG)) as leader, \
            MessageStore(tmp_path / "follower", StoreConfig(**CONFIG)) as follower:
        for s in (leader, follower):
            s.create_topic("t", 1)
        # bodies of varying length: every record has its own size
        leader.append(encode_batch([Message(topic="t", body=b"m" * (1 + i), tag=f"tag{i % 3}", queue_id=0)
                                    for i in range(COUNT)]))
        yield leader, follower


def fetched(leader: MessageStore) -> tuple[bytes, np.ndarray]:
    read = leader.read_runs("t", 0, 0, 1000, 1 << 20)
    assert read.next_offset == COUNT and len(read.sizes) == COUNT and int(read.sizes.sum()) == read.size
    assert not len(read.damaged)
    return b"".join(read.views), read.sizes


def test_announced_sizes_store_what_the_leader_has(stores):
    leader, follower = stores
    chunk, sizes = fetched(leader)
    follower.append_replicated(chunk, zlib.crc32(chunk), sizes.astype(">i4"))
    stored = follower.get("t", 0, 0, 1000).records
    assert [bytes(decode_record(bytes(r)).body) for r in stored] == [b"m" * (1 + i) for i in range(COUNT)]
    assert [r.tag for r in map(decode_record, map(bytes, stored))] == [f"tag{i % 3}" for i in range(COUNT)]


@pytest.mark.parametrize("wrong", ["swapped", "short", "long", "tiny", "empty"])
def test_wrong_sizes_are_refused_and_nothing_is_stored(stores, wrong):
    leader, follower = stores
    chunk, sizes = fetched(leader)
    bad = sizes.copy()
    if wrong == "swapped":  # the same total, boundaries in the wrong places
        bad[3], bad[4] = bad[4], bad[3]
    elif wrong == "short":
        bad = bad[:-1]
    elif wrong == "long":
        bad[-1] += 1
    elif wrong == "tiny":  # smaller than a header: must not reach the header gather
        bad[0], bad[1] = 4, bad[0] + bad[1] - 4
    else:
        bad = bad[:0]
    with pytest.raises(CorruptRecord):
        follower.append_replicated(chunk, zlib.crc32(chunk), bad)
    assert follower.max_offset("t", 0) == 0
    follower.append_replicated(chunk, zlib.crc32(chunk), sizes)  # the right sizes still go in
    assert follower.max_offset("t", 0) == COUNT
