"""A follower's map of where its replicated records lay on their leaders: the record a leader's
message id names is found in the follower's store, runs that are not contiguous on either side
are told apart, truncated records are not answered, and the map follows retention."""

from __future__ import annotations

import zlib

import numpy as np
from store_helpers import small_config

from gms.broker.store import MessageStore
from gms.broker.store.origins import runs
from gms.record import Message, decode_record, encode_batch

LEADER = "127.0.0.1:10911"


def replicate(leader: MessageStore, follower: MessageStore, topic: str, queue_id: int) -> None:
    offset = follower.max_offset(topic, queue_id)
    read = leader.read_runs(topic, queue_id, offset, 10_000, 1 << 24)
    chunk = b"".join(bytes(v) for v in read.views)
    follower.append_replicated(chunk, zlib.crc32(chunk), read.sizes, origin=LEADER)


def test_runs_split_where_either_side_is_not_contiguous():
    sizes = np.array([10, 10, 10, 10], np.int64)
    entries = runs(np.array([0, 10, 50, 60]), np.array([100, 110, 120, 200]), sizes, 7)
    assert entries[["leader_phys", "local_phys", "length"]].tolist() == [(0, 100, 20), (50, 120, 10), (60, 200, 10)]


def test_a_leaders_message_ids_resolve_on_the_follower(tmp_path):
    with (MessageStore(tmp_path / "leader", small_config()) as leader,
          MessageStore(tmp_path / "follower", small_config()) as follower):
        for store in (leader, follower):
            store.create_topic("a", 2)
            store.create_topic("b", 1)
        follower.create_topic("own", 1)
        follower.append(encode_batch([Message("own", b"the follower's own")]))  # offsets differ on each side
        sent = []
        for i in range(5):  # the topics' records interleave in the leader's commitlog
            for topic, queue_id in (("a", 0), ("a", 1), ("b", 0)):
                result = leader.append(encode_batch([Message(topic, b"%s%d-%d-%d" % (topic.encode(), queue_id, i, k),
                                                             queue_id=queue_id) for k in range(3)]))
                sent += [(int(p), topic, queue_id) for p in result.phys_offsets]
        for topic, queue_id in (("a", 0), ("a", 1), ("b", 0)):
            replicate(leader, follower, topic, queue_id)
        for phys, _, _ in sent:
            record = follower.find_replicated(LEADER, phys)
            assert record is not None
            assert decode_record(record).body == decode_record(leader.read_at(phys)).body
        assert follower.find_replicated("127.0.0.1:1", sent[0][0]) is None  # another leader's id
        assert follower.find_replicated(LEADER, sent[0][0] + 1) is None  # not a record's start
        follower.truncate_queue("a", 0, 3)  # a follower cut back: the cut records are not answered
        cut = [p for p, topic, q in sent if (topic, q) == ("a", 0)][3:]
        assert all(follower.find_replicated(LEADER, p) is None for p in cut)


def test_the_map_survives_a_restart(tmp_path):
    with (MessageStore(tmp_path / "leader", small_config()) as leader,
          MessageStore(tmp_path / "follower", small_config()) as follower):
        for store in (leader, follower):
            store.create_topic("t", 1)
        result = leader.append(encode_batch([Message("t", b"m%d" % i) for i in range(10)]))
        replicate(leader, follower, "t", 0)
    with MessageStore(tmp_path / "follower", small_config()) as follower:
        assert [bytes(decode_record(follower.find_replicated(LEADER, int(p))).body)  # type: ignore[arg-type]
                for p in result.phys_offsets] == [b"m%d" % i for i in range(10)]


def test_a_failed_origin_write_costs_the_id_lookup_not_the_append(tmp_path, caplog):
    """The records are stored and committed before their origins are noted: a write error there
    (a full disk) must not fail an append the replica has already made."""
    with (MessageStore(tmp_path / "leader", small_config()) as leader,
          MessageStore(tmp_path / "follower", small_config()) as follower):
        for store in (leader, follower):
            store.create_topic("a", 1)
        result = leader.append(encode_batch([Message("a", b"m%d" % i) for i in range(3)]))
        origins = tmp_path / "follower" / "origins"
        origins.rmdir()
        origins.write_bytes(b"")  # every file the map opens under it now fails (ENOTDIR)
        replicate(leader, follower, "a", 0)
        assert follower.max_offset("a", 0) == 3
        assert follower.find_replicated(LEADER, int(result.phys_offsets[0])) is None
    assert "will not resolve on this replica" in caplog.text
