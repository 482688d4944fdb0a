"""``confluent-kafka`` (librdkafka) against gms's Kafka API, side by side with gms's own SDK doing
the same work against the same broker process (issue 32).

Workloads (100 B messages, a 4-queue topic, one broker process, everything on 127.0.0.1):
- ``produce``: every message handed to the producer, then a flush that waits for their acks
  (acks=1; librdkafka batches as it does by default, linger 5 ms; gms's ``send_async`` batches
  as its pipeline keeps up);
- ``consume``: every message of the topic read once (confluent-kafka's ``assign`` from offset 0;
  gms's ``Consumer`` from the first), each body read.

For each, the rate the application sees, the broker's CPU time per message (the on-CPU time of
its threads, /proc/PID/task/*/schedstat: nanoseconds, where /proc/PID/stat counts 10 ms ticks, as
much as a whole phase's CPU at 0.1 µs per message) and the client's (the benchmark process's
user + system time: librdkafka's threads, gms's fetcher). ``*_rate_ratio`` is Kafka's rate over
gms's (issue 32's target ≥ 1.0) and ``*_server_cpu_ratio`` Kafka's broker CPU per message over
gms's (target ≤ 1.5). Each phase starts once the broker is idle (what one left to flush is not
counted in the next). The consumers read ``--rounds`` times, alternately (Kafka first, then gms
first ...); each figure is the median of its rounds, each round's rate listed beside it.

A round of the Kafka consumer may stall: librdkafka fetches (one Fetch in flight per broker) into
a local queue that the application's ``consume`` drains, and whenever that queue holds
``queued.min.messages`` (100,000) at a fetch, it pauses fetching for ``fetch.queue.backoff.ms``
(1 s by default) however soon the application drains it; gms's ``Consumer`` fetches again as soon
as ``poll`` takes a chunk. On a host where the application thread is slower than librdkafka's
fetches (on a shared host; with ``--count 1000000`` on a quiet one too) the rate falls to about 100,000 messages per
stall, a client-side pause the broker has no say in (a Kafka broker's faster answers trigger it
sooner). ``--fetch-queue-backoff-ms`` sets it, to measure without those pauses (librdkafka's
documentation advises lowering it when the application sees ~1 s delays); the headline figures
use the clients' defaults. Prints one JSON line. ``--quick`` runs small counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_procs import start_server, stop_servers
from bench_rocketmq_api import _wait_idle

BODY = b"x" * 100
TOPIC = "kafka-bench"
QUEUES = 4
POLL_S = 1.0
READ_TIMEOUT_S = 120
_GROUPS = itertools.count()


def kafka_produce(bootstrap: str, count: int) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, BODY, partition=i % QUEUES)
                break
            except BufferError:  # its queue is full: let deliveries drain it
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(READ_TIMEOUT_S):
        raise RuntimeError("confluent-kafka did not deliver every message")


def kafka_consume(bootstrap: str, count: int, queue_backoff_ms: int | None = None) -> None:
    """``queue_backoff_ms``: librdkafka's fetch.queue.backoff.ms (None: its default, 1 s)."""
    from confluent_kafka import Consumer, TopicPartition
    config: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": "bench-kafka", "enable.auto.commit": False}
    if queue_backoff_ms is not None:
        config["fetch.queue.backoff.ms"] = queue_backoff_ms
    consumer = Consumer(config)
    try:
        consumer.assign([TopicPartition(TOPIC, queue, 0) for queue in range(QUEUES)])
        got, deadline = 0, time.monotonic() + READ_TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, POLL_S):
                if message.error() is None:
                    message.value()
                    got += 1
        if got < count:
            raise RuntimeError(f"confluent-kafka read {got} of {count}")
    finally:
        consumer.close()


def gms_produce(address: str, count: int) -> None:
    """As the Kafka producer: every message handed over, then a flush waits for their acks."""
    from gms.client import Producer
    with Producer([address]) as producer:
        for i in range(count):
            producer.send_async(TOPIC, BODY, queue=i % QUEUES)
        producer.flush()


def gms_consume(address: str, count: int) -> None:
    from gms.client import Consumer
    group = f"bench-gms-{next(_GROUPS)}"  # a new group reads from the first message again
    with Consumer([address], group=group, subscription={TOPIC: "*"}, start_from="first") as consumer:
        got, deadline = 0, time.monotonic() + READ_TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            for message in consumer.poll(POLL_S * 1000):
                message.body  # noqa: B018 - read as an application does
                got += 1
        if got < count:
            raise RuntimeError(f"gms's Consumer read {got} of {count}")


def _server_cpu_s(pid: int) -> float:
    """On-CPU seconds of the process's threads now (a thread that ended is left out: the
    broker's live as long as it does)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except FileNotFoundError:  # ended since listed
            continue
    return total / 1e9


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's, ended ones too
    return usage.ru_utime + usage.ru_stime


def _measured(pid: int, count: int, work: Callable[[], None]) -> tuple[float, float, float]:
    """(messages/s, broker and client CPU µs per message) of ``work`` handling ``count`` messages."""
    started, server, client = time.perf_counter(), _server_cpu_s(pid), _client_cpu_s()
    work()
    elapsed = time.perf_counter() - started
    return count / elapsed, (_server_cpu_s(pid) - server) * 1e6 / count, (_client_cpu_s() - client) * 1e6 / count


def _record(out: dict[str, Any], prefix: str, figures: list[tuple[float, float, float]]) -> None:
    """The medians of a side's rounds (rate, broker and client CPU per message), and each
    round's rate where there were several (a stalled round shows)."""
    rate, server, client = (statistics.median(column) for column in zip(*figures, strict=True))
    out[f"{prefix}_msgs_per_s"], out[f"{prefix}_server_cpu_us"] = round(rate), round(server, 2)
    out[f"{prefix}_client_cpu_us"] = round(client, 2)
    if len(figures) > 1:
        out[f"{prefix}_rounds_msgs_per_s"] = [round(figure[0]) for figure in figures]


def run(count: int, rounds: int, queue_backoff_ms: int | None = None) -> dict[str, Any]:
    from gms.client import Admin
    from gms.nameserver.embedded_etcd import free_port

    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        root = Path(tmp)
        bootstrap = f"127.0.0.1:{free_port()}"
        proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"),
                                  "--kafka-listen", bootstrap)
        address = f"127.0.0.1:{port}"
        out: dict[str, Any] = {}
        try:
            with Admin([address]) as admin:
                admin.create_topic(TOPIC, queues=QUEUES)
            sides: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {
                "kafka": (lambda n: kafka_produce(bootstrap, n),
                          lambda n: kafka_consume(bootstrap, n, queue_backoff_ms)),
                "gms": (lambda n: gms_produce(address, n), lambda n: gms_consume(address, n))}
            for name, (produce, _) in sides.items():
                _wait_idle(proc.pid)  # the files preallocated, what the sends before left flushed
                _record(out, f"{name}_produce", [_measured(proc.pid, count, lambda p=produce: p(count))])
            consumed: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
            for i in range(rounds):  # each reads every message, both sides' (2 × count); alternately first
                for name in sorted(sides, reverse=i % 2 == 0):
                    _wait_idle(proc.pid)
                    consume = sides[name][1]
                    consumed[name].append(_measured(proc.pid, 2 * count, lambda c=consume: c(2 * count)))
            for name, figures in consumed.items():
                _record(out, f"{name}_consume", figures)
        finally:
            stop_servers([proc])
    for workload in ("produce", "consume"):
        out[f"{workload}_rate_ratio"] = round(out[f"kafka_{workload}_msgs_per_s"] / out[f"gms_{workload}_msgs_per_s"],
                                              3)
        out[f"{workload}_server_cpu_ratio"] = round(
            out[f"kafka_{workload}_server_cpu_us"] / max(out[f"gms_{workload}_server_cpu_us"], 0.01), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts (well under a minute)")
    parser.add_argument("--count", type=int, help="messages produced by each client (default 100000; 10000 quick)")
    parser.add_argument("--rounds", type=int, default=3, help="consume rounds of each client (default 3)")
    parser.add_argument("--fetch-queue-backoff-ms", type=int,
                        help="librdkafka's fetch.queue.backoff.ms for the Kafka consumer (default: librdkafka's, 1000)")
    args = parser.parse_args()
    count = args.count or (10_000 if args.quick else 100_000)
    figures = run(count, max(args.rounds, 1), args.fetch_queue_backoff_ms)
    print(json.dumps({"count": count, "rounds": args.rounds, "fetch_queue_backoff_ms": args.fetch_queue_backoff_ms,
                      **figures}))


if __name__ == "__main__":
    main()
