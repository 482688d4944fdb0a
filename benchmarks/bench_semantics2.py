"""Issue 16's figures through the public SDK against a real broker process.

- ``key_lookup_ms_p99``: ``Admin.find_by_key`` latency (p50 and p99 over random keys) once
  ``--keyed`` messages (10 M; 1 M with ``--quick``) carrying a unique key each are indexed;
- ``sql_filter_msgs_per_s``: messages a broker filters per second for a ``Consumer`` subscribed
  with a 10 %-selective SQL92 expression (every message scanned by the broker, the selected tenth
  read by the consumer), ``--filtered`` messages (2 M; 500 k with ``--quick``);
- ``tx_commits_per_s``: transactions of one message each (begin, send the half, commit) one after
  another through the SDK, ``--transactions`` of them (2000; 500 with ``--quick``), and
  ``tx10_commits_per_s`` for transactions of 10 messages over 4 queues (a tenth as many).

- ``idempotent_produce_ratio``: an idempotent producer's rate over a plain one's, ``send_batch``
  of 1000 messages of 100 B to one queue (``--produced`` per round: 1 M; 200 k with ``--quick``;
  ``--rounds`` alternating, medians); ``idempotent_async_ratio`` the same with ``send_async``.

``--parts keys,sql,tx,idem`` picks what runs. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench_e2e import _start_broker

BATCH = 1000


def key_lookups(address: str, keyed: int, lookups: int) -> dict[str, float]:
    from gms.client import Admin, Producer, ProducerRecord
    with Admin([address]) as admin:
        admin.create_topic("keyed", queues=8)
    started = time.perf_counter()
    with Producer([address]) as producer:
        for base in range(0, keyed, BATCH):
            producer.send_batch([ProducerRecord("keyed", b"k" * 50, keys=(f"key-{i}",), queue=i % 8)
                                 for i in range(base, min(base + BATCH, keyed))])
    produce_s = time.perf_counter() - started
    samples = []
    with Admin([address]) as admin:
        for key in random.Random(7).sample(range(keyed), lookups):
            start = time.perf_counter()
            found = admin.find_by_key("keyed", f"key-{key}")
            samples.append((time.perf_counter() - start) * 1000)
            assert len(found) == 1 and found[0].body == b"k" * 50, (key, found)
    samples.sort()
    return {"keyed_messages": keyed, "keyed_produce_msgs_per_s": round(keyed / produce_s),
            "key_lookup_ms_p50": round(statistics.median(samples), 3),
            "key_lookup_ms_p99": round(samples[int(len(samples) * 0.99)], 3)}


def sql_filter(address: str, total: int) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer, ProducerRecord, Sql
    with Admin([address]) as admin:
        admin.create_topic("props", queues=4)
    with Producer([address]) as producer:
        for base in range(0, total, BATCH):
            producer.send_batch([
                ProducerRecord("props", b"p" * 100, queue=i % 4,
                               properties={"region": "eu" if i % 10 == 0 else "us", "amount": str(i % 1000)})
                for i in range(base, min(base + BATCH, total))])
    expected = (total + 9) // 10
    got = 0
    with Consumer([address], group="sql-bench", subscription={"props": Sql("region = 'eu' AND amount >= 0")},
                  start_from="first", max_poll_messages=4096, auto_commit=False) as consumer:
        started = time.perf_counter()
        while got < expected:
            for message in consumer.poll(1000):
                message.body  # noqa: B018 - read as an application does
                got += 1
        elapsed = time.perf_counter() - started
    return {"sql_filtered_messages": total, "sql_selected": got, "sql_filter_msgs_per_s": round(total / elapsed)}


def transactions(address: str, count: int) -> dict[str, float]:
    from gms.client import Admin, Producer
    with Admin([address]) as admin:
        admin.create_topic("tx", queues=4)
    result: dict[str, float] = {}
    with Producer([address], group="tx-bench") as producer:
        for size, runs, name in ((1, count, "tx_commits_per_s"), (10, max(count // 10, 1), "tx10_commits_per_s")):
            started = time.perf_counter()
            for n in range(runs):
                tx = producer.begin_transaction()
                for i in range(size):
                    producer.send("tx", b"t" * 100, queue=(n + i) % 4, transaction=tx)
                tx.commit()
            result[name] = round(runs / (time.perf_counter() - started))
    return result


def idempotent_produce(address: str, total: int, rounds: int) -> dict[str, float]:
    """Idempotent against plain producers: ``total`` messages of 100 B to a 1-queue topic, with
    ``send_batch`` of 1000 and with pipelined ``send_async``, rounds alternating between the two
    producers; the ratio of their median rates (idempotent / plain)."""
    from gms.client import Admin, Producer, ProducerRecord
    with Admin([address]) as admin:
        admin.create_topic("idem", queues=1)
    batch = [ProducerRecord("idem", b"i" * 100)] * BATCH
    rates: dict[tuple[str, bool], list[float]] = {}
    for _ in range(rounds):
        for idempotence in (True, False):
            with Producer([address], idempotence=idempotence) as producer:
                producer.send("idem", b"warm-up")
                started = time.perf_counter()
                for _ in range(total // BATCH):
                    producer.send_batch(batch)
                rates.setdefault(("batch", idempotence), []).append(total / (time.perf_counter() - started))
                started = time.perf_counter()
                for _ in range(total):
                    producer.send_async("idem", b"i" * 100)
                producer.flush()
                rates.setdefault(("async", idempotence), []).append(total / (time.perf_counter() - started))
    median = {key: statistics.median(values) for key, values in rates.items()}
    return {"idempotent_produce_msgs_per_s": round(median[("batch", True)]),
            "plain_produce_msgs_per_s": round(median[("batch", False)]),
            "idempotent_produce_ratio": round(median[("batch", True)] / median[("batch", False)], 3),
            "idempotent_async_ratio": round(median[("async", True)] / median[("async", False)], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keyed", type=int)
    parser.add_argument("--filtered", type=int)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--transactions", type=int)
    parser.add_argument("--produced", type=int, help="messages per round of the idempotence figure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="keys,sql,tx,idem",
                        help="what to measure: keys, sql, tx, idem (comma separated)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    keyed = args.keyed or (1_000_000 if args.quick else 10_000_000)
    filtered = args.filtered or (500_000 if args.quick else 2_000_000)
    transaction_count = args.transactions or (500 if args.quick else 2000)
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = _start_broker(Path(tmp) / "broker")
        try:
            if "keys" in parts:
                result.update(key_lookups(address, keyed, args.lookups))
            if "sql" in parts:
                result.update(sql_filter(address, filtered))
            if "tx" in parts:
                result.update(transactions(address, transaction_count))
            if "idem" in parts:
                result.update(idempotent_produce(address, args.produced or (200_000 if args.quick else 1_000_000),
                                                 args.rounds))
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
