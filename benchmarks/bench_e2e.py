"""End-to-end benchmark: a real broker process driven by the SDK from separate processes.

Prints one JSON line. ``--quick`` shortens every phase (≤ 90 s in all). ``--metrics`` serves the
brokers' /metrics and scrapes it every ``--scrape-interval`` seconds while they run (issue 15:
the figures must stay within 3 % of a run without). Targets (2 cores shared by
broker and clients): produce 100 B ≥ 500k msg/s, 1 KiB ≥ 300 MB/s, consume ≥ 1M msg/s, sync
send p50 ≤ 150 µs / p99 ≤ 500 µs, broker RssAnon ≤ 200 MB. The consume figure reads every message's
topic, tag, keys and body (``benchmarks/bench_consume.py`` times consuming alone).

The asyncio SDK (gms.client.aio, on a uvloop loop as the sync SDK's thread runs) against the sync
one, each measured right after its sync twin, three times (issue 33's targets): ``await send`` p50 /
p99 within 1.1× the sync ``send``'s (``send_await_vs_sync_p50``, medians), pipelined ``send_nowait``
≥ 0.9× ``send_async`` (``produce_nowait_vs_send_async``) and ``AsyncConsumer`` ≥ 0.9× ``Consumer``
(``consume_async_vs_sync``, best rates).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench_procs import start_server

BATCH = 1000
DRAIN_EVERY = 1000  # send_nowait's between two drain()s: the loop sends the batches meanwhile
PAIRS = 3  # sync / asyncio measurements, one right after the other
CONSUME_PAIR_MAX = 1_000_000  # messages each consumer of a pair reads


def _start_broker(root: Path, *args: str) -> tuple[subprocess.Popen, str]:
    root.mkdir(parents=True, exist_ok=True)
    proc, port = start_server("gms.broker", root, "broker", "--store-dir", str(root / "store"), *args)
    return proc, f"127.0.0.1:{port}"


class Scraper(threading.Thread):
    """Fetches a broker's /metrics every ``interval_s``, as Prometheus would."""

    def __init__(self, port: int, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s, self.stop, self.scrapes = f"http://127.0.0.1:{port}/metrics", interval_s, \
            threading.Event(), 0

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            with urllib.request.urlopen(self.url, timeout=10) as answer:
                answer.read()
            self.scrapes += 1


def _metrics_args(enabled: bool) -> tuple[list[str], int]:
    if not enabled:
        return [], 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["--metrics-listen", f"127.0.0.1:{port}"], port


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            except OSError:
                return


def _produce(address: str, topic: str, size: int, seconds: float, out: mp.Queue,
             nameserver: str | None = None) -> None:
    """Send batches for ``seconds``: to ``address`` directly, or routed through ``nameserver``."""
    from gms.client import Producer, ProducerRecord
    body = b"x" * size
    batches = [[ProducerRecord(topic, body, queue=q) for _ in range(BATCH)] for q in range(8)]
    sent = 0
    with (Producer(nameserver=nameserver) if nameserver else Producer([address])) as producer:
        deadline = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            producer.send_batch(batches[sent // BATCH % 8])
            sent += BATCH
        out.put((sent, time.perf_counter() - start))


def _consume(address: str, topic: str, total: int, size: int, out: mp.Queue) -> None:
    """Read ``total`` messages from the start, each message's topic, tag, keys and body."""
    from gms.client import Consumer
    with Consumer([address], group=f"bench-{time.time()}", subscription={topic: "*"}, start_from="first",
                  max_poll_messages=4096, auto_commit=False) as consumer:
        got = 0
        start = None
        nbytes = 0
        while got < total:
            messages = consumer.poll(1000)
            if start is None and messages:
                start = time.perf_counter()
            for m in messages:  # read every message, as an application does
                m.topic  # noqa: B018
                m.tag  # noqa: B018
                m.keys  # noqa: B018
                nbytes += len(m.body)
            got += len(messages)
            if not messages and start is not None:
                break
        assert nbytes == got * size, (nbytes, got, size)
        out.put((got, time.perf_counter() - start))


def _consume_async(address: str, topic: str, total: int, size: int, out: mp.Queue) -> None:
    """:func:`_consume` with the asyncio consumer."""
    from gms.client.aio import AsyncConsumer
    from gms.net import run

    async def main() -> tuple[int, float]:
        async with AsyncConsumer([address], group=f"bench-{time.time()}", subscription={topic: "*"},
                                 start_from="first", max_poll_messages=4096, auto_commit=False) as consumer:
            got, nbytes, start = 0, 0, None
            while got < total:
                messages = await consumer.poll(1000)
                if start is None and messages:
                    start = time.perf_counter()
                for m in messages:
                    m.topic  # noqa: B018
                    m.tag  # noqa: B018
                    m.keys  # noqa: B018
                    nbytes += len(m.body)
                got += len(messages)
                if not messages and start is not None:
                    break
            assert nbytes == got * size and start is not None, (nbytes, got, size)
            return got, time.perf_counter() - start
    out.put(run(main()))


def _pipelined(address: str, topic: str, seconds: float, out: mp.Queue) -> None:
    """``send_async`` of 100 B messages for ``seconds``, then flush."""
    from gms.client import Producer
    body, sent = b"x" * 100, 0
    with Producer([address]) as producer:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(DRAIN_EVERY):
                producer.send_async(topic, body)
            sent += DRAIN_EVERY
        producer.flush()
        out.put((sent, time.perf_counter() - start))


def _pipelined_async(address: str, topic: str, seconds: float, out: mp.Queue) -> None:
    """:func:`_pipelined` with the asyncio producer's ``send_nowait``."""
    from gms.client.aio import AsyncProducer
    from gms.net import run

    async def main() -> tuple[int, float]:
        body, sent = b"x" * 100, 0
        async with AsyncProducer([address]) as producer:
            start = time.perf_counter()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                for _ in range(DRAIN_EVERY):
                    producer.send_nowait(topic, body)
                sent += DRAIN_EVERY
                await producer.drain()
            await producer.flush()
            return sent, time.perf_counter() - start
    out.put(run(main()))


def _latency_async(address: str, topic: str, count: int, out: mp.Queue) -> None:
    """:func:`_latency` of ``await send``."""
    from gms.client.aio import AsyncProducer
    from gms.net import run

    async def main() -> list[float]:
        samples = []
        async with AsyncProducer([address]) as producer:
            for i in range(count):
                start = time.perf_counter()
                await producer.send(topic, b"x" * 100, queue=i % 8)
                samples.append(time.perf_counter() - start)
        return sorted(samples)
    samples = run(main())
    out.put((samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6))


def _latency(address: str, topic: str, count: int, out: mp.Queue) -> None:
    from gms.client import Producer
    samples = []
    with Producer([address]) as producer:
        for i in range(count):
            start = time.perf_counter()
            producer.send(topic, b"x" * 100, queue=i % 8)
            samples.append(time.perf_counter() - start)
    samples.sort()
    out.put((samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6))


def _sync_senders(address: str, topic: str, threads: int, seconds: float, out: mp.Queue) -> None:
    from gms.client import Producer
    counts = [0] * threads
    with Producer([address]) as producer:
        deadline = time.perf_counter() + seconds

        def loop(n: int) -> None:
            while time.perf_counter() < deadline:
                producer.send(topic, b"x" * 100)
                counts[n] += 1
        workers = [threading.Thread(target=loop, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    out.put((sum(counts), seconds))


def _run(target, *args, **kwargs):
    out: mp.Queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=target, args=(*args, out), kwargs=kwargs)
    proc.start()
    result = out.get(timeout=300)
    proc.join()
    return result


def _asyncio_rows(result: dict[str, float | bool], address: str, seconds: float, sent_100b: int) -> None:
    """The asyncio SDK's figures, each against the sync SDK's measured right before it, ``PAIRS``
    times (a shared machine's load comes and goes): the best rates, the median latencies."""
    rates: dict[str, list[float]] = {"consume": [], "consume_async": [], "send_async": [], "nowait": []}
    latencies: dict[str, list[tuple[float, float]]] = {"sync": [], "await": []}
    count = 3000 if seconds < 10 else 20000
    for _ in range(PAIRS):
        for key, target in (("consume", _consume), ("consume_async", _consume_async)):
            got, elapsed = _run(target, address, "b100", min(sent_100b, CONSUME_PAIR_MAX), 100)
            rates[key].append(got / elapsed)
        for key, target in (("sync", _latency), ("await", _latency_async)):
            latencies[key].append(_run(target, address, "lat", count))
        for key, target, topic in (("send_async", _pipelined, "pipe"), ("nowait", _pipelined_async, "pipe-async")):
            sent, elapsed = _run(target, address, topic, seconds / PAIRS)
            rates[key].append(sent / elapsed)
    best = {key: max(values) for key, values in rates.items()}
    result["consume_async_msgs_per_s_100b"] = round(best["consume_async"])
    result["consume_async_vs_sync"] = round(best["consume_async"] / best["consume"], 2)
    (sync_p50, sync_p99), (p50, p99) = (tuple(map(statistics.median, zip(*latencies[key], strict=True)))
                                        for key in ("sync", "await"))
    result["send_await_p50_us"], result["send_await_p99_us"] = round(p50), round(p99)
    result["send_await_vs_sync_p50"] = round(p50 / sync_p50, 2)
    result["send_await_vs_sync_p99"] = round(p99 / sync_p99, 2)
    result["produce_send_async_msgs_per_s_100b"] = round(best["send_async"])
    result["produce_nowait_msgs_per_s_100b"] = round(best["nowait"])
    result["produce_nowait_vs_send_async"] = round(best["nowait"] / best["send_async"], 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--metrics", action="store_true", help="serve /metrics and scrape it during the run")
    parser.add_argument("--scrape-interval", type=float, default=5.0)
    args = parser.parse_args()
    seconds = 5.0 if args.quick else 15.0
    from gms.client import Admin
    result: dict[str, float | bool] = {"metrics": args.metrics}
    with tempfile.TemporaryDirectory() as tmp:
        metrics_args, metrics_port = _metrics_args(args.metrics)
        proc, address = _start_broker(Path(tmp) / "async", *metrics_args)
        sampler = RssSampler(proc.pid)
        sampler.start()
        scraper = Scraper(metrics_port, args.scrape_interval) if args.metrics else None
        if scraper is not None:
            scraper.start()
        try:
            with Admin([address]) as admin:
                for topic in ("b100", "b1k", "lat", "pipe", "pipe-async"):
                    admin.create_topic(topic, queues=8)
            sent_100b, elapsed = _run(_produce, address, "b100", 100, seconds)
            result["produce_msgs_per_s_100b"] = round(sent_100b / elapsed)
            sent, elapsed = _run(_produce, address, "b1k", 1024, seconds)
            result["produce_mb_per_s_1k"] = round(sent * 1024 / elapsed / 1e6, 1)
            got, elapsed = _run(_consume, address, "b100", sent_100b, 100)
            result["consume_msgs_per_s_100b"] = round(got / elapsed)
            p50, p99 = _run(_latency, address, "lat", 3000 if seconds < 10 else 20000)
            result["send_sync_p50_us"], result["send_sync_p99_us"] = round(p50), round(p99)
            _asyncio_rows(result, address, seconds, sent_100b)
        finally:
            sampler.stop.set()
            if scraper is not None:
                scraper.stop.set()
            proc.terminate()
            proc.wait()
        result["broker_rss_anon_mb"] = round(sampler.peak_kb / 1024, 1)
        metrics_args, _ = _metrics_args(args.metrics)
        proc, address = _start_broker(Path(tmp) / "sync", "--flush", "sync", *metrics_args)
        try:
            with Admin([address]) as admin:
                admin.create_topic("sync", queues=8)
            sent, elapsed = _run(_sync_senders, address, "sync", 64, seconds)
            result["sync_flush_msgs_per_s"] = round(sent / elapsed)
        finally:
            proc.terminate()
            proc.wait()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
