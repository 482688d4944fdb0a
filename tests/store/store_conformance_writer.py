"""Child process of the conformance suite's crash test: opens a store implementation, appends
``batches`` batches of 4 records in sync flush mode, printing each once it is acknowledged
(durable): records so far, commitlog end. Then it waits to be killed, never closing the store."""

import sys
import time
from pathlib import Path

from store_impls import IMPLEMENTATIONS

from gms.record import Message, encode_batch


def main() -> None:
    impl, root, batches = IMPLEMENTATIONS[sys.argv[1]], Path(sys.argv[2]), int(sys.argv[3])
    store = impl.open(root, {"flush_mode": "sync"})
    store.create_topic("t", 2)
    for i in range(0, 4 * batches, 4):
        result = store.append(encode_batch([Message("t", b"%08d" % (i + k), keys=[f"k{i + k}"], queue_id=(i + k) % 2)
                                            for k in range(4)]))
        store.durable_future(result.end_phys_offset).result()
        print(i + 4, result.end_phys_offset, flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
