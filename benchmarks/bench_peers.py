"""gms beside its peers, the way users call it: one run, the same workloads, loopback only.

gms runs as ``gms standalone`` (embedded etcd + nameserver + broker, async flush, acks 1) on free
loopback ports and is driven through the public SDK: ``Producer(nameserver=…)`` and a
``Consumer(nameserver=…, group=…, start_from="first")``. When ``redis-server`` (Redis Streams,
AOF everysec, redis-py with hiredis) and ``nats-server`` (JetStream, file storage, nats-py) are on
PATH and a Python with their clients is found (``--peer-python``, ``$PEER_VENV/bin/python``,
``/tmp/peervenv/bin/python`` or this one), they run in the same run, repetition by repetition in
turn with gms (so the machine's drift hits all alike). Without them only gms's figures are printed.

Workloads (each system gets exactly these):
- W1: 1,000,000 messages of 100 random bytes into one 1-queue topic / stream / subject, 1,000 per
  call, each call waiting for its acknowledgements (gms: ``send_batch`` of 1,000; Redis: a
  non-transactional pipeline of 1,000 XADD; NATS: 1,000 ``publish_async`` then wait, two windows
  in flight). Then read all back from the start, touching every body (gms: ``poll()`` and
  ``len(message.body)``; Redis: ``XREAD COUNT 1000``; NATS: a pull consumer's ``fetch(1000)``).
  Count and bytes are checked.
- W2: the same with 200,000 messages of 1 KiB.
- gms also produces W1 and W2 with ``send_async`` (one call per message, the producer batches and
  pipelines; then ``flush()``), compared with the peers' fastest produce (``ratio_w1_produce_async_…``),
  and ``w2_produce_async_pct_of_tcp_ceiling`` = that 1 KiB rate in MB/s over the loopback TCP
  ceiling between two Python processes measured in the same run (``tcp_ceiling_mb_per_s``).
- The gms consumer reads every message's topic, tag, keys and body (the peers have a payload).
- W3: 20,000 single sends of 100 bytes, one at a time, each waiting for its acknowledgement, after
  1,000 unmeasured warm-up sends: p50 / p99 / p99.9 latency.

Prints one JSON line: every gms figure (``w1_produce_msgs_per_s``, ``w3_p50_us``, …, with the
client's and the broker's CPU, 100 = one core), every peer's (``redis_w1_produce_msgs_per_s``, …)
and ``ratio_<figure>`` = gms / the best peer (throughputs: above 1 is better; latencies: below 1
is better). Medians of ``--reps`` repetitions. ``--quick``: small counts (a smoke test).

    python benchmarks/bench_peers.py [--quick] [--reps 3] [--workloads W1,W2,W3] [--peers auto|none|redis,nats]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FULL = {"n100": 1_000_000, "n1k": 200_000, "nlat": 20_000, "tcp_bytes": 1 << 30}
QUICK = {"n100": 20_000, "n1k": 5_000, "nlat": 2_000, "tcp_bytes": 64 << 20}
PIPE = 1000  # messages per send_batch / pipeline / publish window, and per read
WARMUP_SENDS = 1000
PHASE_TIMEOUT_S = 600
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
TOPIC_SETTLE_S = 0.5  # a new topic reaches the broker through etcd: keep that out of the timings
PEERS = ("redis", "nats")
# Figures where a smaller value is better (the ratio's sense flips).
LATENCIES = ("w3_p50_us", "w3_p99_us", "w3_p999_us")
# gms figures compared with another figure of the peers: send_async against the peers' fastest
# produce (NATS's is its own async publishing).
PEER_FIGURE = {"w1_produce_async_msgs_per_s": "w1_produce_msgs_per_s",
               "w2_produce_async_msgs_per_s": "w2_produce_msgs_per_s"}


# --- measuring -------------------------------------------------------------------------------------


def pct(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of a sorted list (p in 0..100)."""
    n = len(sorted_values)
    return sorted_values[max(0, min(n - 1, math.ceil(p / 100 * n) - 1))]


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (all threads) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Phase:
    """Wall time and the CPU % of this process and of the server over a ``with`` block."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.seconds = self.client_pct = self.server_pct = 0.0

    def __enter__(self) -> Phase:
        t = os.times()
        self._c0, self._s0 = t.user + t.system, cpu_seconds(self.server_pid)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        t = os.times()
        self.client_pct = (t.user + t.system - self._c0) / self.seconds * 100
        self.server_pct = (cpu_seconds(self.server_pid) - self._s0) / self.seconds * 100


class Deadline:
    def __init__(self, seconds: float, what: str) -> None:
        self.end, self.what = time.monotonic() + seconds, what

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise TimeoutError(f"time bound exceeded in {self.what}")


def latency_figures(send: Callable[[], object], n: int, what: str, server_pid: int) -> dict[str, float]:
    """W3: ``WARMUP_SENDS`` unmeasured calls, then ``n`` timed ones; percentiles in µs."""
    for _ in range(WARMUP_SENDS):
        send()
    dl = Deadline(PHASE_TIMEOUT_S, what)
    clock = time.perf_counter_ns
    lat = []
    with Phase(server_pid) as phase:
        for i in range(n):
            if not i & 1023:
                dl.check()
            t0 = clock()
            send()
            lat.append(clock() - t0)
    return latency_result(lat, phase)


def latency_result(lat: list[int], phase: Phase) -> dict[str, float]:
    """W3's percentiles in µs, and what the client and the server spent of a core meanwhile
    (busy polling trades CPU for latency: the figures show what it cost)."""
    lat.sort()
    return {"w3_p50_us": pct(lat, 50) / 1e3, "w3_p99_us": pct(lat, 99) / 1e3, "w3_p999_us": pct(lat, 99.9) / 1e3,
            "w3_cpu_client_pct": phase.client_pct, "w3_cpu_server_pct": phase.server_pct}


def throughput_figures(wl: str, n: int, produce: Phase, consume: Phase) -> dict[str, float]:
    return {f"{wl}_produce_msgs_per_s": n / produce.seconds, f"{wl}_consume_msgs_per_s": n / consume.seconds,
            f"{wl}_produce_cpu_client_pct": produce.client_pct, f"{wl}_produce_cpu_server_pct": produce.server_pct,
            f"{wl}_consume_cpu_client_pct": consume.client_pct, f"{wl}_consume_cpu_server_pct": consume.server_pct}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port}")


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM exactly this process, SIGKILL it if it does not stop."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


# --- gms -------------------------------------------------------------------------------------------


def _child_pid(parent: int, needle: bytes) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ppid == parent and needle in cmdline:
            return int(entry)
    raise RuntimeError(f"no child of {parent} runs {needle.decode()}")


@contextmanager
def gms_standalone(root: Path) -> Iterator[tuple[str, int]]:
    """``gms standalone`` on free ports under ``root``: (nameserver address, broker pid)."""
    gms = str(Path(sys.executable).parent / "gms")
    argv = [gms, "standalone", "--data-dir", str(root / "data"), "--nameserver-port", "0", "--broker-port", "0",
            "--nameserver-metrics-port", "0", "--broker-metrics-port", "0", "--console-port", "0",
            "--rocketmq-port", "0", "--kafka-port", "0",
            "--commitlog-file-size", str(1 << 30),  # the broker default, as measured before (not standalone's)
            "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        banner, end = "", time.monotonic() + START_TIMEOUT_S
        while "broker " not in banner:
            line = proc.stdout.readline()
            if not line or time.monotonic() > end:
                raise RuntimeError(f"gms standalone did not start:\n{banner}")
            banner += line
        match = re.search(r"nameserver\s+(\S+)", banner)
        if match is None:
            raise RuntimeError(f"no nameserver address in the banner:\n{banner}")
        # Drain its output so it never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        broker_pid = _child_pid(proc.pid, b"gms.broker")
        wait_until_idle(broker_pid)
        yield match.group(1), broker_pid
    finally:
        stop_process(proc)


def wait_until_idle(pid: int, window_s: float = 0.5, busy_pct_max: float = 10) -> None:
    """Wait (at most START_TIMEOUT_S) until the process uses under ``busy_pct_max`` % of a core
    over ``window_s``: a new broker pre-faults its commitlog files for a few seconds, which is
    not part of any workload."""
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        before = cpu_seconds(pid)
        time.sleep(window_s)
        if (cpu_seconds(pid) - before) / window_s * 100 < busy_pct_max:
            return


def gms_rep(nameserver: str, broker_pid: int, rep: int, sizes: dict[str, int],
            workloads: list[str]) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer, ProducerRecord

    figures: dict[str, float] = {}
    admin = Admin(nameserver=nameserver)
    try:
        with Producer(nameserver=nameserver) as producer:
            for wl, size, n in (("w1", 100, sizes["n100"]), ("w2", 1024, sizes["n1k"])):
                if wl.upper() not in workloads:
                    continue
                topic = f"bench-{wl}-{rep}"
                admin.create_topic(topic, queues=1)
                time.sleep(TOPIC_SETTLE_S)
                batch = [ProducerRecord(topic, os.urandom(size))] * PIPE
                dl = Deadline(PHASE_TIMEOUT_S, f"gms {wl}")
                with Phase(broker_pid) as produce:
                    sent = 0
                    while sent < n:
                        dl.check()
                        k = min(PIPE, n - sent)
                        assert len(producer.send_batch(batch[:k])) == k
                        sent += k
                got = nbytes = 0
                with Consumer(nameserver=nameserver, group=f"g-{wl}-{rep}", subscription={topic: "*"},
                              start_from="first") as consumer, Phase(broker_pid) as consume:
                    while got < n:
                        dl.check()
                        messages = consumer.poll(timeout_ms=5000)
                        for message in messages:  # every field a consumer routes on, and the body
                            if message.topic != topic or message.tag is not None or message.keys:
                                raise AssertionError(f"unexpected message {message!r}")
                            nbytes += len(message.body)
                        got += len(messages)
                assert got == n and nbytes == n * size, (got, nbytes)
                figures.update(throughput_figures(wl, n, produce, consume))
                figures.update(async_produce_figures(producer, admin, broker_pid, wl, rep, size, n))
            if "W3" in workloads:
                topic = f"bench-w3-{rep}"
                admin.create_topic(topic, queues=1)
                time.sleep(TOPIC_SETTLE_S)
                payload = os.urandom(100)
                figures.update(latency_figures(lambda: producer.send(topic, payload), sizes["nlat"], "gms W3",
                                              broker_pid))
    finally:
        admin.close()
    return figures


def async_produce_figures(producer: Any, admin: Any, broker_pid: int, wl: str, rep: int, size: int,
                          n: int) -> dict[str, float]:
    """W1/W2 produced again with ``send_async`` (the producer batches and pipelines), then
    ``flush()``: every future resolved. Into a topic of its own; not read back."""
    topic = f"bench-{wl}async-{rep}"
    admin.create_topic(topic, queues=1)
    time.sleep(TOPIC_SETTLE_S)
    payload = os.urandom(size)
    send_async = producer.send_async
    dl = Deadline(PHASE_TIMEOUT_S, f"gms {wl} send_async")
    with Phase(broker_pid) as produce:
        futures = []
        for i in range(n):
            if not i & 0xFFFF:
                dl.check()
            futures.append(send_async(topic, payload))
        producer.flush()
    failed = sum(1 for f in futures if f.exception() is not None)
    assert failed == 0, f"{failed} async sends failed"
    return {f"{wl}_produce_async_msgs_per_s": n / produce.seconds,
            f"{wl}_produce_async_mb_per_s": n * size / produce.seconds / 1e6,
            f"{wl}_produce_async_cpu_client_pct": produce.client_pct,
            f"{wl}_produce_async_cpu_server_pct": produce.server_pct}


TCP_CEILING_BYTES = 1 << 30
TCP_CHUNK_BYTES = 64 * 1024


def tcp_sink(port: int, total: int) -> None:
    """Child process of :func:`tcp_ceiling_mb_per_s`: receive ``total`` bytes, answer one."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray(1 << 20)
        got = 0
        while got < total:
            k = sock.recv_into(buf)
            if not k:
                break
            got += k
        sock.sendall(b"K")


def tcp_ceiling_mb_per_s(total: int) -> float:
    """Loopback TCP between two Python processes: ``sendall`` of 64 KiB chunks into a process
    that only receives them (the most any Python client/server pair can move)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sink = subprocess.Popen([sys.executable, __file__, "--tcp-sink", str(port), "--tcp-bytes", str(total)])
        try:
            server.settimeout(START_TIMEOUT_S)
            conn, _ = server.accept()
            with conn:
                chunk = memoryview(os.urandom(TCP_CHUNK_BYTES))
                t0 = time.perf_counter()
                for _ in range(total // TCP_CHUNK_BYTES):
                    conn.sendall(chunk)
                conn.settimeout(PHASE_TIMEOUT_S)
                if conn.recv(1) != b"K":
                    raise RuntimeError("the TCP sink did not receive everything")
                seconds = time.perf_counter() - t0
        finally:
            sink.wait(STOP_TIMEOUT_S)
    return total // TCP_CHUNK_BYTES * TCP_CHUNK_BYTES / seconds / 1e6


# --- peers (each runs in a child process: a Python that has its client) ---------------------------


def redis_rep(rep: int, sizes: dict[str, int], workloads: list[str], root: Path) -> dict[str, Any]:
    import redis

    if not redis.utils.HIREDIS_AVAILABLE:
        raise SystemExit("hiredis is not installed next to redis-py")
    port = free_port()
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(root), "--daemonize", "no",
            "--save", "", "--protected-mode", "yes", "--loglevel", "warning",
            "--appendonly", "yes", "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    figures: dict[str, Any] = {}
    try:
        wait_port(port, proc, "redis-server")
        r = redis.Redis(connection_pool=redis.ConnectionPool(host="127.0.0.1", port=port))
        figures["version"] = f"redis {r.info('server')['redis_version']}, redis-py {redis.__version__} + hiredis"
        for wl, size, n in (("w1", 100, sizes["n100"]), ("w2", 1024, sizes["n1k"])):
            if wl.upper() not in workloads:
                continue
            key, payload = f"bench-{wl}-{rep}", os.urandom(size)
            dl = Deadline(PHASE_TIMEOUT_S, f"redis {wl}")
            pipe = r.pipeline(transaction=False)
            with Phase(proc.pid) as produce:
                sent = 0
                while sent < n:
                    dl.check()
                    k = min(PIPE, n - sent)
                    for _ in range(k):
                        pipe.xadd(key, {b"d": payload})
                    assert len(pipe.execute()) == k
                    sent += k
            last, got, nbytes = b"0-0", 0, 0
            with Phase(proc.pid) as consume:
                while got < n:
                    dl.check()
                    entries = r.xread({key: last}, count=PIPE)[0][1]
                    for _id, fields in entries:
                        nbytes += len(fields[b"d"])
                    got += len(entries)
                    last = entries[-1][0]
            assert got == n and nbytes == n * size, (got, nbytes)
            r.delete(key)
            figures.update(throughput_figures(wl, n, produce, consume))
        if "W3" in workloads:
            key, payload = f"bench-w3-{rep}", os.urandom(100)
            figures.update(latency_figures(lambda: r.xadd(key, {b"d": payload}), sizes["nlat"], "redis W3",
                                              proc.pid))
        r.close()
    finally:
        stop_process(proc)
    return figures


def nats_rep(rep: int, sizes: dict[str, int], workloads: list[str], root: Path) -> dict[str, Any]:
    import importlib.metadata

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

    port = free_port()
    proc = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(root / "js"),
                             "-n", "bench-peers"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    async def run() -> dict[str, Any]:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0, allow_reconnect=False)
        js = nc.jetstream(timeout=10, publish_async_max_pending=4 * PIPE)
        figures: dict[str, Any] = {"version": f"nats-server {nc._server_info.get('version')}, "
                                              f"nats-py {importlib.metadata.version('nats-py')}"}
        for wl, size, n in (("w1", 100, sizes["n100"]), ("w2", 1024, sizes["n1k"])):
            if wl.upper() not in workloads:
                continue
            name, subject, payload = f"BENCH_{wl.upper()}_{rep}", f"bench.{wl}.{rep}", os.urandom(size)
            await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE))
            dl = Deadline(PHASE_TIMEOUT_S, f"nats {wl}")
            with Phase(proc.pid) as produce:
                previous, sent = None, 0
                while sent < n:
                    dl.check()
                    k = min(PIPE, n - sent)
                    window = [await js.publish_async(subject, payload) for _ in range(k)]
                    sent += k
                    if previous is not None:
                        await asyncio.gather(*previous)
                    previous = window
                last_seq = (await asyncio.gather(*previous))[-1].seq  # type: ignore[misc]
            assert last_seq == n, (last_seq, n)
            psub = await js.pull_subscribe(
                subject, durable="bench", stream=name,
                config=ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL, max_ack_pending=-1))
            got = nbytes = 0
            with Phase(proc.pid) as consume:
                while got < n:
                    dl.check()
                    messages = await psub.fetch(PIPE, timeout=10)
                    for message in messages:
                        nbytes += len(message.data)
                    got += len(messages)
                    await messages[-1].ack()
            await psub.unsubscribe()
            assert got == n and nbytes == n * size, (got, nbytes)
            await js.delete_stream(name)
            figures.update(throughput_figures(wl, n, produce, consume))
        if "W3" in workloads:
            name, subject, payload = f"BENCH_W3_{rep}", f"bench.w3.{rep}", os.urandom(100)
            await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE))
            for _ in range(WARMUP_SENDS):
                await js.publish(subject, payload)
            clock, lat = time.perf_counter_ns, []
            dl = Deadline(PHASE_TIMEOUT_S, "nats W3")
            with Phase(proc.pid) as phase:
                for i in range(sizes["nlat"]):
                    if not i & 1023:
                        dl.check()
                    t0 = clock()
                    await js.publish(subject, payload)
                    lat.append(clock() - t0)
            figures.update(latency_result(lat, phase))
            await js.delete_stream(name)
        await nc.close()
        return figures

    try:
        wait_port(port, proc, "nats-server")
        return asyncio.run(run())
    finally:
        stop_process(proc)


PEER_REPS = {"redis": redis_rep, "nats": nats_rep}
PEER_SERVERS = {"redis": "redis-server", "nats": "nats-server"}
PEER_MODULES = {"redis": "import redis, hiredis", "nats": "import nats"}


def peer_python(peer: str, given: str | None) -> str | None:
    """A Python that can import ``peer``'s client, or None."""
    candidates = [given] if given else [
        os.path.join(os.environ["PEER_VENV"], "bin", "python") if os.environ.get("PEER_VENV") else None,
        "/tmp/peervenv/bin/python", sys.executable]
    for python in candidates:
        if python and os.access(python, os.X_OK) and subprocess.run(
                [python, "-c", PEER_MODULES[peer]], capture_output=True, check=False).returncode == 0:
            return python
    return None


def run_peer_rep(peer: str, python: str, rep: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One repetition of ``peer``'s workloads in a child process running this file."""
    cmd = [python, __file__, "--peer-child", peer, "--rep", str(rep), "--workloads", args.workloads,
           "--dir", str(root), *(["--quick"] if args.quick else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * PHASE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{peer} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the run ---------------------------------------------------------------------------------------


def median_figures(reps: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in reps[0]:
        values = [r[key] for r in reps if key in r]
        if isinstance(values[0], (int, float)):
            precision = 1 if key.endswith("_pct") or key.endswith("_us") else 0
            out[key] = round(statistics.median(values), precision)
            if not key.endswith("_pct"):
                out[f"{key}_runs"] = [round(v, precision) for v in values]
        else:
            out[key] = values[0]
    return out


def ratios(gms: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``ratio_<figure>``: gms over the best peer's figure, and which peer that was."""
    out: dict[str, Any] = {}
    for key, value in gms.items():
        if key.endswith("_runs") or key.endswith("_pct") or not isinstance(value, (int, float)):
            continue
        peer_key = PEER_FIGURE.get(key, key)
        have = {name: figures[peer_key] for name, figures in peers.items() if peer_key in figures}
        if not have:
            continue
        pick = min if key in LATENCIES else max
        best = pick(have, key=have.__getitem__)
        out[f"ratio_{key}"] = round(value / have[best], 3)
        out[f"best_peer_{key}"] = best
    return out


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke test)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default="W1,W2,W3")
    ap.add_argument("--peers", default="auto", help="auto (those found), none, or a list such as redis,nats")
    ap.add_argument("--peer-python", help="a Python with the peers' clients (redis-py + hiredis, nats-py)")
    ap.add_argument("--peer-child", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--tcp-sink", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tcp-bytes", type=int, default=TCP_CEILING_BYTES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tcp_sink:  # inside the receiving child of the TCP ceiling
        tcp_sink(args.tcp_sink, args.tcp_bytes)
        return
    sizes = QUICK if args.quick else FULL
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]

    if args.peer_child:  # inside the child process of one peer repetition
        root = Path(tempfile.mkdtemp(prefix=f"{args.peer_child}-", dir=args.dir))
        try:
            print(json.dumps(PEER_REPS[args.peer_child](args.rep, sizes, workloads, root)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return

    wanted = PEERS if args.peers == "auto" else () if args.peers == "none" else tuple(args.peers.split(","))
    peer_pythons: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for peer in wanted:
        python = peer_python(peer, args.peer_python)
        if shutil.which(PEER_SERVERS[peer]) is None:
            skipped[peer] = f"no {PEER_SERVERS[peer]} on PATH"
        elif python is None:
            skipped[peer] = "no Python with its client (see --peer-python)"
        else:
            peer_pythons[peer] = python
    for peer, why in skipped.items():
        log(f"skip {peer}: {why}")

    gms_reps: list[dict[str, Any]] = []
    peer_reps: dict[str, list[dict[str, Any]]] = {peer: [] for peer in peer_pythons}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        root = Path(tmp)
        with gms_standalone(root / "gms") as (nameserver, broker_pid):
            for rep in range(args.reps):  # the systems in turn, rep by rep
                gms_reps.append(gms_rep(nameserver, broker_pid, rep, sizes, workloads))
                gms_reps[-1]["tcp_ceiling_mb_per_s"] = tcp_ceiling_mb_per_s(sizes["tcp_bytes"])
                log(f"gms rep {rep}: {json.dumps({k: round(v) for k, v in gms_reps[-1].items()})}")
                for peer, python in peer_pythons.items():
                    peer_reps[peer].append(run_peer_rep(peer, python, rep, args, root))
                    log(f"{peer} rep {rep}: {json.dumps(peer_reps[peer][-1])}")
    gms = median_figures(gms_reps)
    if "w2_produce_async_mb_per_s" in gms:
        gms["w2_produce_async_pct_of_tcp_ceiling"] = round(
            100 * gms["w2_produce_async_mb_per_s"] / gms["tcp_ceiling_mb_per_s"], 1)
    peers = {peer: median_figures(reps) for peer, reps in peer_reps.items()}
    result: dict[str, Any] = {"bench": "peers", "quick": args.quick, "reps": args.reps, **sizes, **gms}
    for peer, figures in peers.items():
        result.update({f"{peer}_{key}": value for key, value in figures.items() if not key.endswith("_runs")})
    result.update(ratios(gms, peers))
    if skipped:
        result["skipped_peers"] = skipped
    print(json.dumps(result))


if __name__ == "__main__":
    main()
