"""``confluent-kafka`` (librdkafka) against gms's Kafka API, side by side with gms's own SDK doing
the same work against the same broker process (issue 32).

Workloads (100 B messages, a 4-queue topic, one broker process, everything on 127.0.0.1):
- ``produce``: pipelined sends with acks=1 (librdkafka batches as it does by default, linger 5 ms;
  gms's ``send_async`` with at most ``WINDOW`` unacknowledged);
- ``consume``: every message of the topic read once (confluent-kafka's ``assign`` from offset 0;
  gms's ``Consumer`` from the first), each body read.

For each, the rate the application sees and the broker's CPU time per message (user + system,
from /proc); ``*_rate_ratio`` is Kafka's rate over gms's (issue 32's target ≥ 1.0) and
``*_server_cpu_ratio`` Kafka's broker CPU per message over gms's (target ≤ 1.5). Prints one JSON
line. ``--quick`` runs small counts.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_procs import start_server, stop_servers
from bench_rocketmq_api import _measured, _pipelined, _wait_idle

BODY = b"x" * 100
TOPIC = "kafka-bench"
QUEUES = 4
POLL_S = 1.0
READ_TIMEOUT_S = 120


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


def kafka_consume(bootstrap: str, count: int) -> None:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-kafka", "enable.auto.commit": False})
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
    from gms.client import Producer
    with Producer([address]) as producer:
        _pipelined(lambda i: producer.send_async(TOPIC, BODY, queue=i % QUEUES), count)


def gms_consume(address: str, count: int) -> None:
    from gms.client import Consumer
    with Consumer([address], group="bench-gms", subscription={TOPIC: "*"}, start_from="first") as consumer:
        got, deadline = 0, time.monotonic() + READ_TIMEOUT_S
        while got < count and time.monotonic() < deadline:
            for message in consumer.poll(POLL_S * 1000):
                message.body  # noqa: B018 - read as an application does
                got += 1
        if got < count:
            raise RuntimeError(f"gms's Consumer read {got} of {count}")


def run(count: int) -> dict[str, float]:
    from gms.client import Admin
    from gms.nameserver.embedded_etcd import free_port

    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        root = Path(tmp)
        bootstrap = f"127.0.0.1:{free_port()}"
        proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"),
                                  "--kafka-listen", bootstrap)
        address = f"127.0.0.1:{port}"
        out: dict[str, float] = {}
        try:
            with Admin([address]) as admin:
                admin.create_topic(TOPIC, queues=QUEUES)
            _wait_idle(proc.pid)
            sides: dict[str, tuple[Callable[[int], None], Callable[[int], None]]] = {
                "kafka": (lambda n: kafka_produce(bootstrap, n), lambda n: kafka_consume(bootstrap, n)),
                "gms": (lambda n: gms_produce(address, n), lambda n: gms_consume(address, n))}
            for name, (produce, _) in sides.items():
                rate, cpu = _measured(proc.pid, count, lambda p=produce: p(count))
                out[f"{name}_produce_msgs_per_s"], out[f"{name}_produce_server_cpu_us"] = round(rate), round(cpu, 1)
            for name, (_, consume) in sides.items():  # each reads every message, both sides' (2 × count)
                rate, cpu = _measured(proc.pid, 2 * count, lambda c=consume: c(2 * count))
                out[f"{name}_consume_msgs_per_s"], out[f"{name}_consume_server_cpu_us"] = round(rate), round(cpu, 1)
        finally:
            stop_servers([proc])
    for workload in ("produce", "consume"):
        out[f"{workload}_rate_ratio"] = round(out[f"kafka_{workload}_msgs_per_s"] / out[f"gms_{workload}_msgs_per_s"],
                                              3)
        out[f"{workload}_server_cpu_ratio"] = round(
            out[f"kafka_{workload}_server_cpu_us"] / max(out[f"gms_{workload}_server_cpu_us"], 0.1), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts (well under a minute)")
    parser.add_argument("--count", type=int, help="messages produced by each client (default 100000; 10000 quick)")
    args = parser.parse_args()
    count = args.count or (10_000 if args.quick else 100_000)
    print(json.dumps({"count": count, **run(count)}))


if __name__ == "__main__":
    main()
