"""Child process of the crash test: appends in sync mode and prints each durable end offset."""

import sys

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch


def main() -> None:
    root = sys.argv[1]
    store = MessageStore.open(root, StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=100,
                                           flush_mode="sync"))
    if "t" not in store.topics():
        store.create_topic("t", 2)
    i = 0
    while True:
        msgs = [Message("t", b"msg-%08d" % (i + k) + b"." * ((i + k) % 50), tag="even" if (i + k) % 2 == 0
                        else "odd", queue_id=(i + k) % 2) for k in range(7)]
        result = store.append(encode_batch(msgs))
        store.durable_future(result.end_phys_offset).result()
        print(i + 7, result.end_phys_offset, flush=True)
        i += 7


if __name__ == "__main__":
    main()
