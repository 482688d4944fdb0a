"""What message traces cost a producer (docs/traces.md): ``--messages`` messages of 100 B sent
with ``send_batch`` of ``--batch`` through a real broker, untraced and with ``trace=True``
(alternating, ``--rounds`` each; the best of each counts). Prints one JSON line: msg/s of both
and ``trace_ratio`` (traced / untraced throughput), and the trace records written.

    python benchmarks/bench_trace.py            # 200 k messages, batches of 1000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_e2e import _start_broker


def produce(address: str, topic: str, messages: int, batch: int, trace: bool) -> tuple[float, int]:
    from gms.client import Producer, ProducerRecord
    body = b"x" * 100
    batches = [[ProducerRecord(topic, body) for _ in range(batch)] for _ in range(messages // batch)]
    with Producer([address], trace=trace) as producer:
        producer.send_batch(batches[0][:1])  # routes and connections
        started = time.perf_counter()
        for records in batches:
            producer.send_batch(records)
        elapsed = time.perf_counter() - started
        dispatcher = producer._trace.dispatcher if producer._trace is not None else None
    written = dispatcher.written if dispatcher is not None else 0
    if dispatcher is not None:
        assert not dispatcher.dropped and not dispatcher.lost, (dispatcher.dropped, dispatcher.lost)
    return messages / elapsed, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from gms.client import Admin
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = _start_broker(Path(tmp) / "broker")
        try:
            with Admin([address]) as admin:
                admin.create_topic("bench", queues=8)
            plain, traced, written = 0.0, 0.0, 0
            for _ in range(args.rounds):
                plain = max(plain, produce(address, "bench", args.messages, args.batch, trace=False)[0])
                rate, written = produce(address, "bench", args.messages, args.batch, trace=True)
                traced = max(traced, rate)
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps({"messages": args.messages, "batch": args.batch, "plain_msgs_per_s": round(plain),
                      "traced_msgs_per_s": round(traced), "trace_ratio": round(traced / plain, 3),
                      "trace_records_per_run": written}))


if __name__ == "__main__":
    main()
