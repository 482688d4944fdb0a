"""Child process of the key index crash test: appends keyed messages in sync mode, checkpoints
rarely (recovery must re-index what came after), and prints each durable message count."""

import sys

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch


def main() -> None:
    store = MessageStore.open(sys.argv[1], StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=100,
                                                       flush_mode="sync", checkpoint_interval_ms=300,
                                                       key_index_slots=64, key_index_entries_per_file=500))
    if "t" not in store.topics():
        store.create_topic("t", 2)
    i = 0
    while True:
        msgs = [Message("t", b"m-%d" % (i + k), keys=(f"order-{i + k}", "shared"), queue_id=(i + k) % 2)
                for k in range(5)]
        store.durable_future(store.append(encode_batch(msgs)).end_phys_offset).result()
        i += 5
        print(i, flush=True)


if __name__ == "__main__":
    main()
