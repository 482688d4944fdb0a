"""File-descriptor limits: a mapped file costs at most one descriptor, the broker raises its soft
RLIMIT_NOFILE to the hard limit at start, and a store refuses new files with a clear error while
descriptors are still left -- the failed send stores nothing and the broker goes on serving."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from processes import TEST_COMMITLOG_FILE_SIZE_BYTES, BrokerProcess

from gms import record as rec
from gms.broker.mapped_file import FD_HEADROOM
from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.client import Admin, Producer
from gms.errors import GmsError
from gms.record import encode_record
from gms.store_errors import DescriptorLimitReached

CQ_FILE_ENTRIES = 2  # a new index file every second message of a queue


def descriptors(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def steady_descriptors(pid: int) -> int:
    """The process's open descriptors less those a background thread holds for a moment (the
    flush thread's directory fsync): the fewest of a few looks."""
    counts = []
    for _ in range(5):
        counts.append(descriptors(pid))
        time.sleep(0.02)
    return min(counts)


def mapped_files(store_dir: Path) -> int:
    return sum(1 for path in store_dir.rglob("*") if path.is_file() and path.name.isdigit())


@pytest.fixture
def small_index_broker(broker_factory) -> BrokerProcess:
    return broker_factory("--cq-file-entries", str(CQ_FILE_ENTRIES))


def test_broker_uses_at_most_one_descriptor_per_mapped_file(small_index_broker):
    broker = small_index_broker
    with Admin([broker.address]) as admin, Producer([broker.address], retries=0) as producer:
        admin.create_topic("many", queues=32)
        producer.send("many", b"first", queue=0)  # connections are open from here on
        fds, files = steady_descriptors(broker.proc.pid), mapped_files(broker.store_dir)
        for queue in range(32):
            for i in range(6):
                producer.send("many", b"m%d" % i, queue=queue)
        new_fds = steady_descriptors(broker.proc.pid) - fds
        new_files = mapped_files(broker.store_dir) - files
    assert new_files >= 32 * 2
    assert new_fds <= new_files, f"{new_fds} descriptors for {new_files} new mapped files"


def test_broker_raises_its_soft_descriptor_limit_to_the_hard_one(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 512:
        pytest.skip(f"needs a finite hard RLIMIT_NOFILE above 512 (it is {hard})")
    broker = BrokerProcess(tmp_path / "broker", [])
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))  # inherited by the broker
    try:
        broker.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        broker.stop()


def test_store_refuses_new_files_before_the_descriptors_run_out(tmp_path):
    store = MessageStore.open(tmp_path / "store", StoreConfig(cq_entries_per_file=CQ_FILE_ENTRIES,
                                                         commitlog_file_size_bytes=1 << 20,
                                                         warm_next_file=False))
    store.create_topic("t", 256)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = descriptors() + FD_HEADROOM + 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        with pytest.raises(DescriptorLimitReached, match=f"RLIMIT_NOFILE is {limit}") as refused:
            for queue in range(256):
                store.append(encode_record(topic="t", body=b"x", queue_id=queue))
        assert store.max_offset("t", queue) == 0  # the refused send stored nothing
        assert limit - descriptors() >= FD_HEADROOM - 4  # refused while descriptors were left
        free = [os.open("/dev/null", os.O_RDONLY) for _ in range(FD_HEADROOM - 8)]
        for fd in free:
            os.close(fd)
        assert store.append(encode_record(topic="t", body=b"y", queue_id=0)).queue_offsets.tolist() == [1]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        store.close()
    assert refused.value.limit == limit


def test_broker_at_its_descriptor_limit_fails_sends_cleanly_and_recovers_after_sigkill(small_index_broker):
    """The broker's limit is lowered while it runs (prlimit); sends to new queues then fail with an
    error naming the limit, sends to queues with room go on, and after SIGKILL every acknowledged
    message is in the store exactly once, at the offset it was acknowledged with."""
    broker = small_index_broker
    acked: dict[tuple[int, int], bytes] = {}
    with Admin([broker.address]) as admin, Producer([broker.address], retries=0) as producer:
        admin.create_topic("many", queues=256)
        producer.send("many", b"warm-up", queue=0)
        limit = descriptors(broker.proc.pid) + FD_HEADROOM + 16
        _, hard = resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (limit, hard))
        refusal = None
        for queue in range(256):
            body = b"q%d" % queue
            try:
                result = producer.send("many", body, queue=queue)
            except GmsError as err:
                refusal = err
                break
            acked[result.queue_id, result.queue_offset] = body
        assert refusal is not None and "RLIMIT_NOFILE" in str(refusal), refusal
        for i in range(3):  # room for one more entry in queue 1's index file, then it needs a new one
            body = b"again%d" % i
            try:
                result = producer.send("many", body, queue=1)
            except GmsError as err:
                assert "RLIMIT_NOFILE" in str(err)
                continue
            acked[result.queue_id, result.queue_offset] = body
        resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (hard, hard))
        result = producer.send("many", b"after", queue=queue)
        assert result.queue_offset == 0  # the refused send left no trace in its queue
        acked[result.queue_id, result.queue_offset] = b"after"
    broker.kill()
    config = StoreConfig(commitlog_file_size_bytes=TEST_COMMITLOG_FILE_SIZE_BYTES, cq_entries_per_file=CQ_FILE_ENTRIES)
    with MessageStore(broker.store_dir / "store", config) as store:
        assert store.recovered_from_crash
        stored = {}
        for queue_id in range(256):
            for offset, view in enumerate(store.get("many", queue_id, 0, 1000).records):
                r = rec.decode_record(view)
                assert (r.queue_id, r.queue_offset) == (queue_id, offset)
                stored[queue_id, offset] = bytes(r.body)
    del stored[0, 0]  # the warm-up
    assert stored == acked
