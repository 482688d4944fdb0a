"""A group's read of many topics, in the store alone: ``get`` of each queue against one
``get_many`` of them all (what a FETCH of a group subscribed to 1,000 topics costs the broker).

A MessageStore in a temporary directory, N topics of 4 queues, 50 records of 100 B per queue
appended round-robin over the topics (so each queue's records lie thinly among the others'); then
every queue read from offset 0 (4,096 messages, 4 MiB per queue at most, coalesced views), with
``get`` queue after queue and with one ``get_many`` (no total budget reached). One JSON line:
microseconds per queue, best of ``--rounds``.

    python benchmarks/bench_get_many.py [--topics 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gms.broker.store import MessageStore, QueueGet
from gms.broker.store.topic_table import TopicLimits
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch

QUEUES = 4
RECORDS = 50
PAYLOAD = 100


def fill(root: Path, topics: int) -> MessageStore:
    store = MessageStore.open(root, StoreConfig())
    names = [f"topic-{i:05d}" for i in range(topics)]
    store.create_topics({name: (QUEUES, TopicLimits()) for name in names})
    body = b"x" * PAYLOAD
    for _ in range(RECORDS):
        for name in names:
            store.append(encode_batch([Message(name, body, queue_id=q) for q in range(QUEUES)]))
    return store


def best_us(call, rounds: int, queues: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best / queues * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-get-many-") as tmp:
        store = fill(Path(tmp) / "store", args.topics)
        try:
            queues = [QueueGet(f"topic-{i:05d}", q, 0) for i in range(args.topics) for q in range(QUEUES)]

            def one_by_one() -> None:
                for topic, queue_id, offset, _ in queues:
                    store.get(topic, queue_id, offset, 4096, 4 << 20, None, None, coalesce=True)

            def at_once() -> None:
                found = store.get_many(queues, 4096, 4 << 20, 1 << 40)
                assert len(found) == len(queues)

            get_us = best_us(one_by_one, args.rounds, len(queues))
            many_us = best_us(at_once, args.rounds, len(queues))
        finally:
            store.close()
    print(json.dumps({"topics": args.topics, "queues": len(queues), "records_per_queue": RECORDS,
                      "get_us_per_queue": round(get_us, 2), "get_many_us_per_queue": round(many_us, 2),
                      "speedup": round(get_us / many_us, 1)}))


if __name__ == "__main__":
    main()
