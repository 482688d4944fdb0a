"""Consume benchmark: a Consumer group reading every message's topic, tag, keys and body.

Starts one broker on an ephemeral loopback port, fills two 1-queue topics through the SDK
(``send_batch`` of 1,000: 1,000,000 × 100 B and 200,000 × 1 KiB, as the peer workloads W1 and
W2 do), then times, in a fresh process each, a ``Consumer`` group with ``start_from="first"``
polling until it has read every message (``m.topic``, ``m.tag``, ``m.keys``, ``len(m.body)``),
``--reps`` times, 100 B and 1 KiB alternately. Also times materialising messages in-process
(decoding a PULL response and reading those four fields of each message, no I/O).

Prints one JSON line: consume_100b_msgs_per_s, consume_1k_msgs_per_s (medians),
ns_per_message_materialise (decoding a response and making its messages, median, 100 B records),
ns_per_message_materialise_and_read (the same and reading the four fields of each), every run.

    python benchmarks/bench_consume.py [--n100 N --n1k N --reps R --tagged]

``--tagged`` gives every message a tag (one of 4) and a key of its own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_procs import start_server, stop_servers

BATCH = 1000


def _fill(address: str, topic: str, n: int, size: int, tagged: bool) -> None:
    from gms.client import Producer, ProducerRecord
    payload = os.urandom(size)
    with Producer([address]) as producer:
        sent = 0
        while sent < n:
            k = min(BATCH, n - sent)
            if tagged:
                batch = [ProducerRecord(topic, payload, tag=f"tag{i % 4}", keys=(f"key-{sent + i}",))
                         for i in range(k)]
            else:
                batch = [ProducerRecord(topic, payload)] * k
            assert len(producer.send_batch(batch)) == k
            sent += k


def _use_client(path: str | None) -> None:
    """Import gms from ``path`` (an install of another commit) instead of this checkout."""
    if path:
        sys.path.insert(0, path)


def _touch(messages) -> tuple[int, int, int, int]:
    """Read every message's topic, tag, keys and body: (body bytes, topic chars, tags, keys)."""
    nbytes = ntopic = ntags = nkeys = 0
    for m in messages:
        ntopic += len(m.topic)
        ntags += m.tag is not None
        nkeys += len(m.keys)
        nbytes += len(m.body)
    return nbytes, ntopic, ntags, nkeys


def _consume(client_path: str | None, address: str, topic: str, n: int, size: int, out: mp.Queue) -> None:
    _use_client(client_path)
    from gms.client import Consumer
    got = nbytes = 0
    with Consumer([address], group=f"bench-{topic}-{time.time_ns()}", subscription={topic: "*"},
                  start_from="first", auto_commit=False) as consumer:
        start = time.perf_counter()
        cpu = time.process_time()
        while got < n:
            messages = consumer.poll(5000)
            nbytes += _touch(messages)[0]
            got += len(messages)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
    assert got == n and nbytes == n * size, (got, n, nbytes)
    out.put((elapsed, cpu))


def _run(target, *args):
    """``target(*args, queue)`` in a fresh process; what it puts in the queue."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out))
    proc.start()
    result = out.get(timeout=600)
    proc.join()
    return result


def _materialise(client_path: str | None, tagged: bool, out: mp.Queue) -> None:
    _use_client(client_path)
    out.put(materialise_ns(tagged=tagged))


def materialise_ns(n: int = 5_000, size: int = 100, tagged: bool = False, reps: int = 15) -> tuple[float, float]:
    """Median ns per message (in this process, no I/O) to decode a PULL response body of ``n``
    records (about one 1 MiB response) and make every message; and to do that and read each
    message's topic, tag, keys and body as well."""
    from gms.client.body_decode import decode_pull_body
    from gms.record import encode_record, write_broker_fields
    from gms.tags import MATCH_ALL
    payload = os.urandom(size)
    records = bytearray()
    for i in range(n):
        raw = bytearray(encode_record(topic="bench", body=payload, tag=f"tag{i % 4}" if tagged else None,
                                      keys=(f"key-{i}",) if tagged else ()))
        write_broker_fields(raw, 0, 0, i, len(records), 1)
        records += raw
    body = memoryview(bytes(records))
    made, read = [], []
    for _ in range(reps):
        start = time.perf_counter_ns()
        messages = list(decode_pull_body(body, "7F00000100002A4B", MATCH_ALL, verify_crc=False))
        made.append((time.perf_counter_ns() - start) / n)
        del messages
        start = time.perf_counter_ns()
        nbytes = _touch(decode_pull_body(body, "7F00000100002A4B", MATCH_ALL, verify_crc=False))[0]
        read.append((time.perf_counter_ns() - start) / n)
        assert nbytes == n * size
    return statistics.median(made), statistics.median(read)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n100", type=int, default=1_000_000)
    parser.add_argument("--n1k", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tagged", action="store_true", help="a tag and a key of its own per message")
    parser.add_argument("--broker-path", help="run the broker with this PYTHONPATH (e.g. an install of "
                        "another commit, to compare clients against one broker)")
    parser.add_argument("--vs-client-path", help="also run the consumers with gms imported from this "
                        "path, alternately with this checkout's; its figures are prefixed vs_")
    a = parser.parse_args()
    from gms.client import Admin
    clients = {"": None} if not a.vs_client_path else {"": None, "vs_": a.vs_client_path}
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        saved = os.environ.get("PYTHONPATH")
        if a.broker_path:
            os.environ["PYTHONPATH"] = a.broker_path
        try:
            proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"),
                                      "--commitlog-file-size", str(1 << 30))
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        address = f"127.0.0.1:{port}"
        try:
            with Admin([address]) as admin:
                admin.create_topic("c100", queues=1)
                admin.create_topic("c1k", queues=1)
            _fill(address, "c100", a.n100, 100, a.tagged)
            _fill(address, "c1k", a.n1k, 1024, a.tagged)
            for _ in range(a.reps):
                for prefix, path in clients.items():
                    for name, topic, n, size in (("100b", "c100", a.n100, 100), ("1k", "c1k", a.n1k, 1024)):
                        elapsed, cpu_s = _run(_consume, path, address, topic, n, size)
                        runs.setdefault(f"{prefix}consume_{name}_msgs_per_s", []).append(round(n / elapsed))
                        runs.setdefault(f"{prefix}client_cpu_pct_{name}", []).append(round(100 * cpu_s / elapsed))
                    made, read = _run(_materialise, path, a.tagged)
                    runs.setdefault(f"{prefix}ns_per_message_materialise", []).append(round(made, 1))
                    runs.setdefault(f"{prefix}ns_per_message_materialise_and_read", []).append(round(read, 1))
        finally:
            stop_servers([proc])
    result: dict[str, object] = {name: statistics.median(values) for name, values in runs.items()
                                 if "cpu" not in name}
    if a.vs_client_path:
        for name in ("consume_100b_msgs_per_s", "consume_1k_msgs_per_s"):
            result[f"ratio_{name}"] = round(statistics.median(
                x / y for x, y in zip(runs[name], runs[f"vs_{name}"], strict=True)), 2)
    result.update({f"{name}_runs": values for name, values in runs.items()})
    result["tagged"] = a.tagged
    print(json.dumps(result))


if __name__ == "__main__":
    main()
