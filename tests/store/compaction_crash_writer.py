"""Child process of the compaction crash test: appends keyed records (every 7th a tombstone) in
sync mode, prints each durable sequence number, and compacts (slowly: a low IO rate) every few
batches, so a SIGKILL lands anywhere in a compaction, a retention run or an append."""

import sys

from compaction_helpers import KEYS, TOPIC, keyed_batch

from gms.broker.store import MessageStore
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store_config import StoreConfig

CONFIG = {"commitlog_file_size_bytes": 16 * 1024, "cq_entries_per_file": 100, "flush_mode": "sync",
          "checkpoint_interval_ms": 1, "compaction_io_bytes_per_s": 50_000,
          "compaction_check_interval_ms": 3_600_000}


def main() -> None:
    store = MessageStore.open(sys.argv[1], StoreConfig(**CONFIG))
    if TOPIC not in store.topics():
        store.create_topic(TOPIC, 1, TopicLimits(cleanup_policy="compact", segment_roll_messages=10,
                                                 dirty_ratio=0.0))
    seq = store.max_offset(TOPIC, 0)
    print("start", seq, flush=True)
    while True:
        result = store.append(keyed_batch(seq, 10))
        store.durable_future(result.end_phys_offset).result()
        seq += 10
        print("acked", seq, flush=True)
        if seq % 50 == 0:
            print("compacting", seq, flush=True)
            store.compact()
            store.delete_expired()
            print("compacted", seq, flush=True)


if __name__ == "__main__":
    assert KEYS
    main()
