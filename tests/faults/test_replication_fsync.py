"""``replica_fsync_before_ack``: a follower flushes what it fetched before its next fetch
acknowledges it, so an acks=-1 send with flush=sync is on disk on every ISR member when it is
answered -- not only in the followers' page caches until their next periodic flush."""

from __future__ import annotations

from ha_helpers import BROKER_TOML, HaCluster, request

from gms.protocol.codes import RequestCode
from gms.record import Message, encode_batch

CONFIG = BROKER_TOML + """replica_fsync_before_ack = true

[store]
flush_interval_ms = 60000
checkpoint_interval_ms = 60000
"""


def test_acks_all_with_sync_flush_is_on_every_isr_members_disk_when_answered(tmp_path):
    config = tmp_path / "fsync.toml"
    config.write_text(CONFIG)
    cluster = HaCluster(tmp_path, broker_args=("--config", str(config), "--flush", "sync"))
    cluster.start(nameservers=1, brokers=3)
    try:
        cluster.create_topic("durable", 1)
        queue = cluster.topic("durable").queues[0]
        leader = cluster.broker_by_id(queue.leader)
        for round_ in range(5):
            body = encode_batch([Message(topic="durable", body=b"x" * 200, queue_id=0)] * (round_ + 1))
            request(leader.address, RequestCode.SEND, {"acks": -1}, body)
            for broker_id in queue.isr:
                status = request(cluster.broker_by_id(broker_id).address, RequestCode.BROKER_STATUS, {})
                assert status["flushed_offset"] == status["commitlog_max_offset"], (broker_id, status)
    finally:
        cluster.stop()
