"""A replicated compacted queue: leader and follower compact on their own to the same offsets
(same records, same rules, the point bounded by the high watermark), and after the leader is
killed the new leader serves the compacted log and goes on compacting what follows."""

from __future__ import annotations

import shutil

import pytest
from compaction_cluster_helpers import CLEANER_TOML, compacted, compacted_chunks, keyed, read_from_start
from ha_helpers import BROKER_TOML, HaCluster, request, wait_for
from processes import free_port
from scrape import scrape

from gms.broker.server import broker_id_for
from gms.client import Producer
from gms.protocol.codes import RequestCode

TIMEOUT_S = 60
pytestmark = pytest.mark.timeout(150)


def queues_compacted(port: int) -> float:
    return scrape(port).get(("gms_broker_compaction_queues_compacted_total", ()), 0.0)


@pytest.mark.slow
def test_replicas_compact_alike_and_a_new_leader_serves_the_compacted_log(tmp_path):
    config = tmp_path / "cleaner.toml"
    config.write_text(BROKER_TOML + CLEANER_TOML)
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config))).start(nameservers=1, brokers=0)
    try:
        ports = {}
        for _ in range(2):
            port = free_port()
            ports[broker_id_for(cluster.add_broker("--metrics-listen", f"127.0.0.1:{port}").address)] = port
        cluster.wait_registered(2)
        cluster.create_topic("cr", 1, replicas=2, min_isr=1)
        request(cluster.nameservers[0].address, RequestCode.UPDATE_TOPIC, {"topic": "cr", "settings": {
            "cleanup_policy": "compact", "segment_roll_messages": 10, "dirty_ratio": 0.0}})
        queue = cluster.topic("cr").queues[0]
        leader = cluster.broker_by_id(queue.leader)
        follower = next(b for b in cluster.brokers if b is not leader)
        follower_port = ports[broker_id_for(follower.address)]
        with Producer(nameserver=cluster.nameserver) as producer:
            for first in range(0, 200, 50):
                producer.send_batch(keyed("cr", first, 50))
            wait_for(lambda: compacted(read_from_start(leader.address, "cr"), 200, 200), TIMEOUT_S, 0.2)
            on_leader = read_from_start(leader.address, "cr")
            # the follower compacts on its own once its high watermark reaches the point: its first
            # offset is then the first kept record's below 200 (it answers QUERY_MIN_OFFSET)
            producer.send_batch(keyed("cr", 200, 1))
            first_kept = on_leader[0][0]
            wait_for(lambda: request(follower.address, RequestCode.QUERY_MIN_OFFSET,
                                     {"topic": "cr", "queue_id": 0})["offset"] == first_kept, TIMEOUT_S, 0.2)
            assert queues_compacted(follower_port) >= 1
            leader.kill()
            wait_for(lambda: cluster.topic("cr").queues[0].leader == broker_id_for(follower.address), 30)
            # the new leader serves the same compacted records at the same offsets
            wait_for(lambda: [r for r in read_from_start(follower.address, "cr") if r[0] < 200]
                     == [r for r in on_leader if r[0] < 200], TIMEOUT_S, 0.2)
            producer.send_batch(keyed("cr", 201, 49))
        wait_for(lambda: compacted(read_from_start(follower.address, "cr"), 250, 250), TIMEOUT_S, 0.2)
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.parametrize("lost", ["store", "compacted"])
def test_a_follower_that_lost_its_data_copies_the_leaders_compacted_log(tmp_path, lost):
    """A follower restarted with an empty data directory is behind the leader's compaction point;
    one that lost its compacted logs only (as one a version before REPLICA_COMPACTED started over
    at the leader's point) holds nothing below its first offset. Either copies the leader's
    compacted log (in chunks of a record: a tiny fetch byte bound), so once the leader is killed
    it serves, from the start, the latest value of every key at the old leader's offsets."""
    config = tmp_path / "cleaner.toml"
    config.write_text(BROKER_TOML.replace("[broker]\n", "[broker]\nreplica_fetch_bytes_max = 100\n") + CLEANER_TOML)
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config))).start(nameservers=1, brokers=2)
    try:
        cluster.wait_registered(2)
        cluster.create_topic("cw", 1, replicas=2, min_isr=1)
        request(cluster.nameservers[0].address, RequestCode.UPDATE_TOPIC, {"topic": "cw", "settings": {
            "cleanup_policy": "compact", "segment_roll_messages": 10, "dirty_ratio": 0.0}})
        leader = cluster.broker_by_id(cluster.topic("cw").queues[0].leader)
        follower = next(b for b in cluster.brokers if b is not leader)
        with Producer(nameserver=cluster.nameserver) as producer:
            for first in range(0, 200, 50):
                producer.send_batch(keyed("cw", first, 50))
            producer.send_batch(keyed("cw", 200, 1))  # the HW passes 200: the leader may compact to it
        wait_for(lambda: compacted(read_from_start(leader.address, "cw"), 201, 200), TIMEOUT_S, 0.2)
        on_leader = read_from_start(leader.address, "cw")
        follower_id = broker_id_for(follower.address)
        wait_for(lambda: request(follower.address, RequestCode.QUERY_MIN_OFFSET,
                                 {"topic": "cw", "queue_id": 0})["offset"] == on_leader[0][0], TIMEOUT_S, 0.2)
        follower.stop()
        wait_for(lambda: follower_id not in cluster.topic("cw").queues[0].isr, TIMEOUT_S, 0.2)
        shutil.rmtree(follower.store_dir if lost == "store" else follower.store_dir / "store" / "compacted")
        follower.restart()
        # back in the ISR: it caught up with the leader's HW (201)
        wait_for(lambda: follower_id in cluster.topic("cw").queues[0].isr, TIMEOUT_S, 0.2)
        leader.kill()
        wait_for(lambda: cluster.topic("cw").queues[0].leader == follower_id, 30)
        # the wiped replica, now leading, serves what the old leader served: the same offsets
        wait_for(lambda: read_from_start(follower.address, "cw") == on_leader, TIMEOUT_S, 0.2)
        # REPLICA_COMPACTED sends whole records, at least one a chunk, and starts over from byte 0
        # when asked for another point than the leader's
        epoch = cluster.topic("cw").queues[0].leader_epoch
        point, chunks = compacted_chunks(follower.address, "cw", epoch, 1, point=190)
        assert point == 200 and all(len(chunk) == 1 for chunk in chunks)
        assert [r.queue_offset for chunk in chunks for r in chunk] == [o for o, _, _ in on_leader if o < 200]
        assert compacted_chunks(follower.address, "cw", epoch, 1 << 20)[1] == [[r for c in chunks for r in c]]
    finally:
        cluster.stop()
