"""Replication across damaged records, with real processes (etcd, a nameserver, three brokers).

A record damaged on the leader's disk (a flipped bit, seen at once through the store's shared
map) travels to a follower that was behind as damaged: the follower is not stuck on it, its
queue reaches the leader's end with the same offsets, the offset is answered as damaged on both
and every other record is served. A record damaged on a follower's disk is found by its
recovery after a SIGKILL and re-fetched from the leader: the follower's store then answers every
message, its copy byte-equal to the leader's outside the envelope."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gms_cluster import COMMITLOG_FILE_SIZE_BYTES
from ha_helpers import BROKER_TOML, HaCluster, request, wait_for
from processes import TEST_CQ_FILE_ENTRIES, BrokerProcess

from gms.broker.server import broker_id_for
from gms.broker.store import GetStatus, MessageStore
from gms.broker.store_config import StoreConfig
from gms.protocol.codes import RequestCode
from gms.record import OFF_STORE_TS, Message, decode_record, encode_batch, scan_records

TOPIC = "dmg"


def send(cluster: HaCluster, leader: BrokerProcess, start: int, count: int) -> None:
    batch = encode_batch([Message(topic=TOPIC, body=b"m-%04d" % i, queue_id=0) for i in range(start, start + count)])
    request(leader.address, RequestCode.SEND, {"acks": -1}, batch)


def max_offset(broker: BrokerProcess) -> int:
    return request(broker.address, RequestCode.TOPIC_STATS, {"topic": TOPIC})["queues"][0]["max_offset"]


def wait_in_sync_on_disk(broker: BrokerProcess, end: int) -> None:
    """Wait until the broker holds TOPIC/0 up to ``end`` and its saved replication state names the
    queue's epoch and that high watermark: a broker killed before that restarts without an epoch
    history and refetches the queue from 0 (KIP-101), and the damage this test planted is gone."""
    path = broker.store_dir / "store" / "config" / "replication.json"

    def saved() -> bool:
        state = json.loads(path.read_bytes())["queues"].get(TOPIC, {}).get("0", {})
        return bool(state.get("epochs")) and state.get("hw") == end

    wait_for(lambda: max_offset(broker) == end and saved(), 10)


def record_at(broker: BrokerProcess, queue_offset: int) -> tuple[Path, int, int]:
    """(commitlog file, position, size) of the record of TOPIC/0 at ``queue_offset``."""
    for path in sorted((broker.store_dir / "store" / "commitlog").iterdir()):
        data = path.read_bytes()
        for start in scan_records(data, verify_crc=False).starts:
            record = decode_record(data, start, verify_crc=False)
            if record.topic == TOPIC and record.queue_offset == queue_offset:
                return path, start, record.total_size
    raise AssertionError(f"no record at offset {queue_offset} in {broker.store_dir}")


def flip(path: Path, pos: int, mask: int = 0x04) -> None:
    """Flip bits of a byte in the file (a running broker's shared map sees it at once)."""
    with open(path, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)[0]
        fh.seek(pos)
        fh.write(bytes([byte ^ mask]))


def flip_body(broker: BrokerProcess, queue_offset: int) -> None:
    """Flip a bit in the last body byte of a record: its CRC fails."""
    path, pos, size = record_at(broker, queue_offset)
    flip(path, pos + size - 1)


def stored_offsets(broker: BrokerProcess) -> set[int]:
    """The queue offsets of TOPIC/0 that have a record in the broker's commitlog files."""
    found = set()
    for path in sorted((broker.store_dir / "store" / "commitlog").iterdir()):
        data = path.read_bytes()
        for start in scan_records(data, verify_crc=False).starts:
            record = decode_record(data, start, verify_crc=False)
            if record.topic == TOPIC:
                found.add(record.queue_offset)
    return found


def read_stopped(broker: BrokerProcess) -> tuple[dict[int, bytes], list[int], int]:
    """A stopped broker's queue straight from its store: (offset -> body of every record served,
    damaged offsets, max offset)."""
    config = StoreConfig(commitlog_file_size_bytes=COMMITLOG_FILE_SIZE_BYTES, cq_entries_per_file=TEST_CQ_FILE_ENTRIES)
    store = MessageStore.open(broker.store_dir / "store", config)
    try:
        served: dict[int, bytes] = {}
        damaged: list[int] = []
        offset = store.min_offset(TOPIC, 0)
        while (got := store.get(TOPIC, 0, offset, 16)).status is GetStatus.FOUND:
            for view in got.records:
                record = decode_record(bytes(view))  # checks the CRC
                served[record.queue_offset] = bytes(record.body)
            damaged += [d[0] for d in got.damaged]
            offset = got.next_offset
        return served, damaged, store.max_offset(TOPIC, 0)
    finally:
        store.close()


def expected(count: int, without: tuple[int, ...] = ()) -> dict[int, bytes]:
    return {i: b"m-%04d" % i for i in range(count) if i not in without}


@pytest.fixture
def cluster(tmp_path):
    # No checkpoint while running (the first would come an hour after start): a SIGKILLed
    # broker's recovery scans all it stored.
    config = tmp_path / "store.toml"
    config.write_text(BROKER_TOML + "\n[store]\ncheckpoint_interval_ms = 3600000\n")
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config))).start(nameservers=1, brokers=3)
    yield cluster
    cluster.stop()


@pytest.mark.slow
def test_follower_behind_fetches_past_a_record_damaged_on_the_leader(cluster):
    cluster.create_topic(TOPIC, 1)
    queue = cluster.topic(TOPIC).queues[0]
    leader = cluster.broker_by_id(queue.leader)
    behind = next(b for b in cluster.brokers if b is not leader)
    behind_id = broker_id_for(behind.address)
    send(cluster, leader, 0, 10)
    behind.kill()
    wait_for(lambda: behind_id not in cluster.topic(TOPIC).queues[0].isr, 20)
    send(cluster, leader, 10, 40)
    framing = record_at(leader, 35)
    flip_body(leader, 25)  # its CRC fails
    flip(framing[0], framing[1] + 2, 0x01)  # 35: its length field too: the framing is broken
    flip(framing[0], framing[1] + framing[2] - 1)
    pulled = request(leader.address, RequestCode.PULL, {"topic": TOPIC, "queue_id": 0, "offset": 20, "max_msgs": 20})
    assert [d[0] for d in pulled["damaged"]] == [25, 35] and pulled["next_offset"] == 40

    behind.restart()  # fetches 10.. from the leader: 25 and 35 come as damaged, not as data
    wait_for(lambda: max_offset(behind) == 50, 20)
    wait_for(lambda: behind_id in cluster.topic(TOPIC).queues[0].isr, 20)  # not stuck: back in sync
    send(cluster, leader, 50, 5)  # and it keeps following
    wait_for(lambda: max_offset(behind) == 55, 20)
    failed = [line for line in behind.log_tail(1_000_000).splitlines() if "replica fetch from" in line]
    assert not [line for line in failed if "record" in line], failed  # no append was refused on the way
    assert "offsets 25..25 are damaged on the leader" in behind.log_tail(1_000_000)
    assert stored_offsets(behind) == set(range(55)) - {25, 35}  # the damaged bytes were never stored

    cluster.stop()
    for broker in (leader, behind):
        served, damaged, end = read_stopped(broker)
        assert (end, damaged) == (55, [25, 35]), broker.store_dir
        assert served == expected(55, without=(25, 35)), broker.store_dir
    in_sync = next(b for b in cluster.brokers if b not in (leader, behind))
    assert read_stopped(in_sync)[0] == expected(55)  # it had them before the flips


@pytest.mark.slow
def test_follower_repairs_its_damaged_copy_from_the_leader_after_a_restart(cluster):
    cluster.create_topic(TOPIC, 1)
    queue = cluster.topic(TOPIC).queues[0]
    leader = cluster.broker_by_id(queue.leader)
    follower = next(b for b in cluster.brokers if b is not leader)
    follower_id = broker_id_for(follower.address)
    send(cluster, leader, 0, 30)
    wait_in_sync_on_disk(follower, 30)
    flip_body(follower, 17)
    follower.kill()
    follower.restart()  # recovery finds 17 damaged; the follower asks the leader for it again
    wait_for(lambda: "offset 17 repaired from leader" in follower.log_tail(1_000_000), 20)
    wait_for(lambda: follower_id in cluster.topic(TOPIC).queues[0].isr, 20)
    send(cluster, leader, 30, 5)
    wait_for(lambda: max_offset(follower) == 35, 20)

    cluster.stop()
    served, damaged, end = read_stopped(follower)
    assert (end, damaged) == (35, [])
    assert served == expected(35)
    repaired, original = (record_at(b, 17) for b in (follower, leader))
    copies = [path.read_bytes()[pos: pos + size] for path, pos, size in (repaired, original)]
    assert copies[0][OFF_STORE_TS:] == copies[1][OFF_STORE_TS:]  # the producer bytes and store time


@pytest.mark.slow
def test_a_record_damaged_on_both_stays_damaged_and_replication_goes_on(cluster):
    cluster.create_topic(TOPIC, 1)
    queue = cluster.topic(TOPIC).queues[0]
    leader = cluster.broker_by_id(queue.leader)
    follower = next(b for b in cluster.brokers if b is not leader)
    send(cluster, leader, 0, 20)
    wait_in_sync_on_disk(follower, 20)
    flip_body(follower, 12)
    flip_body(leader, 12)
    follower.kill()
    follower.restart()
    wait_for(lambda: "offset 12 is damaged here and the leader" in follower.log_tail(1_000_000), 20)
    send(cluster, leader, 20, 5)
    wait_for(lambda: max_offset(follower) == 25, 20)
    log_text = follower.log_tail(1_000_000)
    assert log_text.count("offset 12 is damaged here") == 1  # given up on, not asked again

    cluster.stop()
    for broker in (leader, follower):
        served, damaged, end = read_stopped(broker)
        assert (end, damaged) == (25, [12]), broker.store_dir
        assert served == expected(25, without=(12,))
