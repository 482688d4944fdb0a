"""Many topics and queues on one broker: what they cost, and what creating them costs everyone else.

Real processes on free loopback ports, driven through the public SDK; one JSON line with the
figures of every scenario (``--only NAME``: one of them):

- ``create`` (:func:`run`): one ``gms standalone``; a live producer (a process of its own) sends
  100 B messages one at a time to a topic that exists before the run while ``Admin.create_topic``
  creates N topics of 4 queues one call each, then ``Admin.delete_topic`` deletes them.
  ``create_topics_s``, ``create_ms_first`` / ``create_ms_last`` (the mean call over the first and
  last 10 %), ``live_send_p50_ms`` / ``_p99_ms`` / ``_max_ms`` while creating (``..._delete``
  while deleting), ``first_send_after_create_s`` (from the last create call's return until a send
  to that topic is acknowledged), ``data_dir_bytes_per_empty_queue`` (allocated blocks, as ``du``),
  ``broker_rss_mb``, ``delete_topics_s``.
- ``produce``, ``consume``, ``control``, ``queues``: see their functions' docstrings.

    python benchmarks/bench_scale.py [--quick] [--topics N] [--only NAME]

``--quick``: smaller runs (creation: 300 topics; full: 1,000 topics and 10,000 queues).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_peers import gms_standalone, pct, stop_process, wait_until_idle

QUEUES = 4
PAYLOAD = 100
SETTLE_TIMEOUT_S = 60
FIRST_SEND_TIMEOUT_S = 600
LIVE_TOPIC = "live"
CONSUME_TIMEOUT_S = 600
PRODUCE_ROUNDS = 5  # passes of 1 and of N topics, taken in turn (medians)
PRODUCE_MESSAGES, PRODUCE_MESSAGES_QUICK = 2_000_000, 600_000  # a pass (see scenario_produce)
CONSUME_ROUNDS = 3  # fresh groups of 1 and of N topics, read in turn (medians)


def allocated_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (st_blocks, as ``du`` counts them)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def send_until_acknowledged(producer: Any, topic: str, payload: bytes, timeout_s: float) -> None:
    """Send to ``topic`` until the broker takes it (a topic it does not know yet is refused)."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            producer.send(topic, payload)
            return
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def live_producer(nameserver: str, ready: Any, stop: Any, out: Any) -> None:
    """Send to the live topic one message at a time until ``stop``; put (start, latency) of each
    send in ``out`` (ns; starts on the machine-wide monotonic clock)."""
    from gms.client import Producer

    payload = os.urandom(PAYLOAD)
    clock = time.monotonic_ns
    lat: list[tuple[int, int]] = []
    with Producer(nameserver=nameserver) as producer:
        send_until_acknowledged(producer, LIVE_TOPIC, payload, SETTLE_TIMEOUT_S)
        for _ in range(200):  # warm-up
            producer.send(LIVE_TOPIC, payload)
        ready.set()
        while not stop.is_set():
            t0 = clock()
            producer.send(LIVE_TOPIC, payload)
            lat.append((t0, clock() - t0))
    out.put(lat)


def latencies_between(sends: list[tuple[int, int]], start_ns: int, end_ns: int) -> list[int]:
    """The sorted latencies of the sends started in [start_ns, end_ns)."""
    return sorted(lat for t0, lat in sends if start_ns <= t0 < end_ns)


def wait_dropped(broker: Any, names: set[str], timeout_s: float) -> None:
    """Wait until the broker's own topic table holds none of ``names``."""
    end = time.monotonic() + timeout_s
    while names & set(broker.topics()):
        if time.monotonic() > end:
            raise TimeoutError("the broker did not drop the deleted topics")
        time.sleep(0.05)


def run(topics: int) -> dict[str, float]:
    from gms.client import Admin, Producer

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, broker_pid):
        data_dir = Path(tmp) / "data"
        admin = Admin(nameserver=nameserver)
        admin.create_topic(LIVE_TOPIC, queues=1)
        broker = Admin(admin.brokers())
        ctx = mp.get_context("spawn")
        ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
        live = ctx.Process(target=live_producer, args=(nameserver, ready, stop, out), daemon=True)
        live.start()
        if not ready.wait(SETTLE_TIMEOUT_S):
            raise TimeoutError("the live producer did not start")
        bytes_before = allocated_bytes(data_dir)
        names = [f"t{i:05d}" for i in range(topics)]
        times: list[float] = []
        create_start_ns = time.monotonic_ns()
        t_start = time.perf_counter()
        for name in names:
            t0 = time.perf_counter()
            admin.create_topic(name, queues=QUEUES)
            times.append(time.perf_counter() - t0)
        created = time.perf_counter()
        with Producer(nameserver=nameserver) as producer:
            send_until_acknowledged(producer, names[-1], os.urandom(PAYLOAD), FIRST_SEND_TIMEOUT_S)
        first_send = time.perf_counter() - created
        create_end_ns = time.monotonic_ns()
        # The creations are done: what the new (all but one empty) queues hold on disk.
        growth = allocated_bytes(data_dir) - bytes_before
        rss = rss_mb(broker_pid)
        t_delete = time.perf_counter()
        for name in names:
            admin.delete_topic(name)
        deleted = time.perf_counter()
        wait_dropped(broker, set(names), FIRST_SEND_TIMEOUT_S)
        delete_end_ns = time.monotonic_ns()
        stop.set()
        sends = out.get(timeout=SETTLE_TIMEOUT_S)
        live.join(SETTLE_TIMEOUT_S)
        lat = latencies_between(sends, create_start_ns, create_end_ns)
        lat_delete = latencies_between(sends, create_end_ns, delete_end_ns)
        tenth = max(1, topics // 10)
        broker.close()
        admin.close()
        return {
            "topics": topics, "queues_per_topic": QUEUES,
            "create_topics_s": created - t_start,
            "create_ms_first": sum(times[:tenth]) / tenth * 1e3,
            "create_ms_last": sum(times[-tenth:]) / tenth * 1e3,
            "live_sends": len(lat),
            "live_send_p50_ms": pct(lat, 50) / 1e6 if lat else -1,
            "live_send_p99_ms": pct(lat, 99) / 1e6 if lat else -1,
            "live_send_max_ms": lat[-1] / 1e6 if lat else -1,
            "first_send_after_create_s": first_send,
            "data_dir_bytes_per_empty_queue": growth / (topics * QUEUES),
            "broker_rss_mb": rss,
            "delete_topics_s": deleted - t_delete,
            "live_sends_delete": len(lat_delete),
            "live_send_p99_ms_delete": pct(lat_delete, 99) / 1e6 if lat_delete else -1,
            "live_send_max_ms_delete": lat_delete[-1] / 1e6 if lat_delete else -1,
        }


# --- the control plane (scenario_control) ------------------------------------------------------

CONTROL_QUEUES = 4
CONTROL_ROUTE_LOOKUPS = 2000
CONTROL_SETTLE_TIMEOUT_S = 600
CONTROL_SERVING_SAMPLE = 20


def metric(metrics: str, series: str) -> float:
    """The value of ``series`` (name and labels, as exposed) on the monitoring endpoint ``metrics``."""
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    return 0.0


ETCD_TXNS = 'gms_nameserver_etcd_request_seconds_count{op="txn"}'
CONTROLLER_TXNS = "gms_nameserver_controller_transactions_total"


def route_latencies(admin: Any, names: list[str]) -> list[int]:
    """CONTROL_ROUTE_LOOKUPS Admin.route calls of topics drawn from ``names``: their latencies (ns), sorted."""
    import random

    rng = random.Random(1)
    lat = []
    for _ in range(CONTROL_ROUTE_LOOKUPS):
        t0 = time.perf_counter_ns()
        admin.route(rng.choice(names))
        lat.append(time.perf_counter_ns() - t0)
    return sorted(lat)


def led_queues(view: Any, broker_id: str) -> list[tuple[str, int]]:
    """The queues ``broker_id`` leads in the cluster view ``view``."""
    return [(t.name, q.queue_id) for t in view.topics() for q in t.queues if q.leader == broker_id]


def scenario_control(quick: bool) -> dict[str, float]:
    """The control plane at scale: a nameserver (embedded etcd) and 2 brokers, topics of 4 queues with
    2 replicas (quick: 600 topics, each broker leading 1,200 queues; full: 2,500 topics, 10,000 queues,
    each broker leading 5,000).

    - ``leadership_assign_s``: creating them in one Admin.create_topics call, which places every queue
      and its leader; ``leadership_txns``: the nameserver's etcd transactions meanwhile;
    - ``route_lookup_p50_ms`` / ``_p99_ms``: Admin.route of a random topic, CONTROL_ROUTE_LOOKUPS times;
      ``route_lookup_1topic_*`` the same with one topic registered, before the others were created;
      ``route_lookup_etcd_writes``: etcd writes meanwhile (the brokers' ISR updates...), which the
      nameserver's watch applies while it answers; ``route_lookup_brokers_cpu``: the cores the two brokers
      used meanwhile (their replica fetchers of 10,000 queues...);
    - then the broker leading the most queues is SIGKILLed: ``failover_s`` from the kill until none of
      the ``failover_queues`` it led has it (or no one) as leader in etcd, as a ClusterView sees it;
      ``failover_detect_s`` until its lease expired (its key's deletion seen); ``failover_routes_s``
      until the nameserver routes the last of them anew (hence all: its watch applies in order);
      ``failover_controller_txns`` the controller's transactions meanwhile (refused ones too);
      ``failover_serving_s`` until a send to each of CONTROL_SERVING_SAMPLE of those queues, drawn at
      random, was acknowledged by its new leader (the broker side); ``lease_ttl_s``: the brokers' lease
      TTL (their default)."""
    import random
    import signal
    import subprocess
    import threading

    from bench_peers import cpu_seconds
    from bench_procs import start_server, stop_servers

    from gms.broker.config import BrokerConfig
    from gms.client import Admin, Producer
    from gms.client.admin import TopicSpec
    from gms.cluster.cluster_view import ClusterView
    from gms.cluster.etcd_client import EtcdClient
    from gms.errors import GmsError
    from gms.protocol.codes import RequestCode

    topics = 600 if quick else 2500
    ttl_s = BrokerConfig().lease_ttl_s
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
        root = Path(tmp)
        try:
            ns, ns_port = start_server("gms.nameserver", root, "ns", "--data-dir", str(root / "ns"),
                                       "--metrics-listen", "127.0.0.1:0",
                                       "--metrics-port-file", str(root / "ns.metrics"))
            procs.append(ns)
            nameserver, metrics = f"127.0.0.1:{ns_port}", f"127.0.0.1:{(root / 'ns.metrics').read_text()}"
            brokers: dict[str, subprocess.Popen[bytes]] = {}
            for i in range(2):
                (root / f"b{i}.toml").write_text("[store]\ncommitlog_file_size_bytes = 67108864\n")
                proc, port = start_server("gms.broker", root, f"b{i}", "--store-dir", str(root / f"b{i}"),
                                          "--nameserver", nameserver, "--config", str(root / f"b{i}.toml"))
                procs.append(proc)
                brokers[f"127.0.0.1:{port}"] = proc
            admin = Admin(nameserver=nameserver)
            end = time.monotonic() + SETTLE_TIMEOUT_S
            while len(admin.brokers()) < 2:
                if time.monotonic() > end:
                    raise TimeoutError("the brokers did not register")
                time.sleep(0.1)
            etcd = admin._ask_nameserver(RequestCode.REGISTER_BROKER)
            client = EtcdClient(etcd["etcd"], timeout_s=10)
            view = ClusterView(client, etcd["prefix"]).start()

            admin.create_topic("c-one", CONTROL_QUEUES, replicas=2)
            lat_one = route_latencies(admin, ["c-one"])  # the same lookups with one topic registered
            names = [f"c{i:05d}" for i in range(topics)]
            txns = metric(metrics, ETCD_TXNS)
            t0 = time.perf_counter()
            results = admin.create_topics([TopicSpec(n, CONTROL_QUEUES, replicas=2) for n in names])
            assign_s = time.perf_counter() - t0
            txns = metric(metrics, ETCD_TXNS) - txns
            if not all(r.created for r in results):
                raise RuntimeError(f"topics not created: {[r for r in results if not r.created][:3]}")
            for proc in brokers.values():  # the brokers take their queues up
                wait_until_idle(proc.pid)

            revision, cpu, t1 = view.revision, sum(cpu_seconds(p.pid) for p in brokers.values()), time.perf_counter()
            lat = route_latencies(admin, names)
            lookup_writes = view.revision - revision  # etcd writes (brokers' ISR updates...) meanwhile
            lookup_brokers_cpu = (sum(cpu_seconds(p.pid) for p in brokers.values()) - cpu) / (time.perf_counter() - t1)

            by_address = {b.address: b.broker_id for b in view.brokers()}
            address = max(brokers, key=lambda a: len(led_queues(view, by_address[a])))
            victim = by_address[address]
            queues = led_queues(view, victim)
            remaining: dict[str, set[int]] = {}
            for topic, queue_id in queues:
                remaining.setdefault(topic, set()).add(queue_id)
            moved = threading.Event()
            detected: list[float] = []
            last_moved: list[str] = []

            def on_change(change: Any) -> None:  # the view's watch thread: O(one topic) per change
                if change.kind.value == "broker_down" and change.name == victim:
                    detected.append(time.perf_counter())
                if change.kind.value != "topic_updated" or change.name not in remaining:
                    return
                states = view.topic(change.name).queues
                left = {i for i in remaining[change.name] if states[i].leader in (None, victim)}
                if left:
                    remaining[change.name] = left
                    return
                del remaining[change.name]
                if not remaining:
                    last_moved.append(change.name)
                    moved.set()

            view.subscribe(on_change)
            controller_txns = metric(metrics, CONTROLLER_TXNS)
            brokers[address].send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            if not moved.wait(CONTROL_SETTLE_TIMEOUT_S):
                raise TimeoutError(f"{sum(map(len, remaining.values()))} queues still without a new leader")
            failover = time.perf_counter() - killed
            def unrouted(names: set[str]) -> set[str]:
                """Those of ``names`` with a queue the nameserver routes to the killed broker or nowhere."""
                return {t for t in names if any(q["leader"] in (None, address) for q in admin.route(t)["queues"])}

            # The nameserver's watch applies etcd's changes in order: once the topic moved last is
            # routed anew, so is every other (checked below, untimed).
            while unrouted(set(last_moved)):
                if time.perf_counter() - killed > CONTROL_SETTLE_TIMEOUT_S:
                    raise TimeoutError(f"{last_moved[0]} still routed to the killed broker")
            routed = time.perf_counter() - killed
            if stale := unrouted({t for t, _ in queues}):
                raise RuntimeError(f"{len(stale)} topics still routed to the killed broker: {sorted(stale)[:5]}")
            controller_txns = metric(metrics, CONTROLLER_TXNS) - controller_txns
            with Producer(nameserver=nameserver) as producer:  # the broker side: do they take sends?
                for topic, queue_id in random.Random(2).sample(queues, min(len(queues), CONTROL_SERVING_SAMPLE)):
                    while True:
                        try:
                            producer.send(topic, b"after failover", queue=queue_id)
                            break
                        except GmsError:
                            if time.perf_counter() - killed > CONTROL_SETTLE_TIMEOUT_S:
                                raise
                            time.sleep(0.02)
            serving = time.perf_counter() - killed
            view.stop()
            client.close()
            admin.close()
        finally:
            stop_servers(procs)
    return {
        "control_topics": topics, "control_queues": topics * CONTROL_QUEUES,
        "leadership_assign_s": assign_s, "leadership_txns": txns,
        "route_lookup_p50_ms": pct(lat, 50) / 1e6, "route_lookup_p99_ms": pct(lat, 99) / 1e6,
        "route_lookup_etcd_writes": lookup_writes, "route_lookup_brokers_cpu": lookup_brokers_cpu,
        "route_lookup_1topic_p50_ms": pct(lat_one, 50) / 1e6, "route_lookup_1topic_p99_ms": pct(lat_one, 99) / 1e6,
        "failover_queues": len(queues), "failover_s": failover, "lease_ttl_s": ttl_s,
        "failover_over_ttl_s": failover - ttl_s,
        "failover_detect_s": detected[0] - killed if detected else -1, "failover_routes_s": routed,
        "failover_controller_txns": controller_txns, "failover_serving_s": serving,
    }


def scenario_queues(quick: bool) -> dict[str, float]:
    """10,000 queues (quick: 2,000) on one broker of its own etcd + nameserver: what an empty
    queue costs in memory, and how long a restart (clean, then after SIGKILL while a producer
    sends) takes until a send to a queue created last and a pull of an old message succeed.

    ``broker_kib_per_queue``: RSS growth from one topic to all of them (a quarter of the queues
    holding a message), per queue; ``restart_{clean,sigkill}_s``: from starting the broker until
    that send and pull succeed, ``..._all_queues_s``: until every queue has a live leader again
    (a consumer of every topic can start); ``broker_rss_mb_after_restart_*``: RSS once it serves."""
    import signal
    import subprocess
    import threading

    from gms.client import Admin, Consumer, Producer
    from gms.nameserver.embedded_etcd import EmbeddedEtcd

    queues = 2_000 if quick else 10_000
    topics = [f"q{i:05d}" for i in range(queues // QUEUES)]
    old_topic, last_topic = topics[0], topics[-1]

    def serve(module: str, root: Path, args: list[str], port: int = 0) -> tuple[subprocess.Popen[Any], int]:
        port_file = root / f"{module}.port"
        port_file.unlink(missing_ok=True)
        with open(root / f"{module}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-P", "-m", module, "--listen", f"127.0.0.1:{port}",
                                     "--port-file", str(port_file), "--log-level", "warning", *args],
                                    stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + SETTLE_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"{module} did not start (see {root / module}.log)")
            time.sleep(0.01)
        return proc, int(port_file.read_text())

    def serving(nameserver: str, offset_dir: Path) -> None:
        """Until a send to the last created queue and a pull of the first message succeed."""
        with Producer(nameserver=nameserver) as producer:
            end = time.monotonic() + SETTLE_TIMEOUT_S
            while True:
                try:
                    producer.send(last_topic, b"after", queue=QUEUES - 1)
                    break
                except Exception:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.01)
        with Consumer(nameserver=nameserver, group=f"g{time.monotonic_ns()}", mode="broadcasting",
                      subscription={old_topic: "*"}, start_from="first", offset_dir=offset_dir) as consumer:
            end = time.monotonic() + SETTLE_TIMEOUT_S
            while not any(bytes(m.body) == b"old" for m in consumer.poll(timeout_ms=100)):
                if time.monotonic() > end:
                    raise TimeoutError("the old message was not pulled after the restart")

    def every_queue_routed(nameserver: str) -> Consumer:
        """Until every queue has a live leader: a consumer of every topic can start (returned to be
        closed out of the timing: closing one of thousands of queues takes seconds)."""
        from gms.errors import ServiceUnavailableError

        end = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            try:
                return Consumer(nameserver=nameserver, group=f"g{time.monotonic_ns()}", mode="broadcasting",
                                subscription=dict.fromkeys(topics, "*"), offset_dir=Path(tmp) / "offsets-all")
            except ServiceUnavailableError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)

    with tempfile.TemporaryDirectory(prefix="bench-queues-") as tmp:
        root = Path(tmp)
        etcd = EmbeddedEtcd(root / "etcd").start()
        procs: list[subprocess.Popen[Any]] = []
        try:
            ns_proc, ns_port = serve("gms.nameserver", root, ["--etcd", etcd.endpoint])
            procs.append(ns_proc)
            nameserver = f"127.0.0.1:{ns_port}"
            broker_args = ["--store-dir", str(root / "broker"), "--nameserver", nameserver,
                           "--commitlog-file-size", str(1 << 30)]
            broker, port = serve("gms.broker", root, broker_args)
            procs.append(broker)
            with Admin(nameserver=nameserver) as admin, Producer(nameserver=nameserver) as producer:
                admin.create_topics([(old_topic, QUEUES)])
                send_until_acknowledged(producer, old_topic, b"old", SETTLE_TIMEOUT_S)
                time.sleep(1)
                rss_one = rss_mb(broker.pid)
                for start in range(1, len(topics), 500):
                    admin.create_topics([(t, QUEUES) for t in topics[start:start + 500]])
                for i, topic in enumerate(topics[1:], 1):  # a quarter of the queues hold a message
                    end = time.monotonic() + SETTLE_TIMEOUT_S
                    while True:
                        try:
                            producer.send(topic, b"x" * PAYLOAD, queue=i % QUEUES)
                            break
                        except Exception:
                            if time.monotonic() > end:
                                raise
                            time.sleep(0.02)
            time.sleep(2)
            rss_all = rss_mb(broker.pid)
            figures: dict[str, float] = {
                "queues": queues,
                "broker_rss_mb_10k_queues": rss_all,
                "broker_rss_mb_1_topic": rss_one,
                "broker_kib_per_queue": (rss_all - rss_one) * 1024 / (queues - QUEUES),
            }
            for kind in ("clean", "sigkill"):
                stop_sending = threading.Event()

                def keep_sending(stop: threading.Event) -> None:
                    with Producer(nameserver=nameserver) as p:
                        i = 0
                        while not stop.is_set():
                            try:
                                p.send(topics[i % len(topics)], b"y" * PAYLOAD)
                            except Exception:  # noqa: BLE001 - the broker is down for a while
                                time.sleep(0.01)
                            i += 1

                sender = threading.Thread(target=keep_sending, args=(stop_sending,), daemon=True)
                if kind == "sigkill":
                    sender.start()
                    time.sleep(1)
                broker.send_signal(signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
                broker.wait(SETTLE_TIMEOUT_S)
                procs.remove(broker)
                t0 = time.monotonic()
                broker, _ = serve("gms.broker", root, broker_args, port)
                procs.append(broker)
                serving(nameserver, root / f"offsets-{kind}")
                figures[f"restart_{kind}_s"] = time.monotonic() - t0
                figures[f"broker_rss_mb_after_restart_{kind}"] = rss_mb(broker.pid)
                consumer = every_queue_routed(nameserver)
                figures[f"restart_{kind}_all_queues_s"] = time.monotonic() - t0
                consumer.close()
                stop_sending.set()
                if sender.is_alive():
                    sender.join(SETTLE_TIMEOUT_S)
            return figures
        finally:
            for proc in reversed(procs):
                stop_process(proc)
            etcd.stop()


def scenario_produce(quick: bool, messages: int | None = None) -> dict[str, float]:
    """``send_async`` of 100 B messages round-robin over 1, 10, 100 and N topics of 4 queues
    (quick: N = 300, full: 1,000) on one gms standalone, each point acknowledged in full (flush),
    back to back in one run: msg/s per point and N topics' rate over one topic's (1 and N topics:
    the medians of PRODUCE_ROUNDS passes taken in turn).

    A pass sends ``messages`` (quick: 600 k, full: 2 M), so that one lasts about a second: a
    throughput, not mostly the start and end of a send. Each pass ends with a flush, which sends
    each topic's last batch part-filled: with 1,000 topics and 400 k messages those were 1,000
    batches of ~90 messages, a quarter of the pass's messages and of its time, and a one-topic
    pass lasted 0.17 s. (``--produce-messages 400000`` measures it so.) Each pass starts once the
    broker is idle: the background work of the pass before (warming the next commitlog file it
    rolled to, a checkpoint's syncs) would otherwise land in whichever pass comes next."""
    from gms.client import Admin, Producer, TopicSpec

    many = 300 if quick else 1000
    counts = [1, 10, 100, many]
    messages = messages or (PRODUCE_MESSAGES_QUICK if quick else PRODUCE_MESSAGES)
    payload = os.urandom(PAYLOAD)
    rates: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-produce-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, broker_pid), Admin(nameserver=nameserver) as admin:
        names = [f"p{i:05d}" for i in range(many)]
        admin.create_topics([TopicSpec(name, QUEUES) for name in names])
        with Producer(nameserver=nameserver) as producer:
            send_until_acknowledged(producer, names[-1], payload, FIRST_SEND_TIMEOUT_S)
            for name in names:  # every queue written once: a queue's first write is not the point here
                for queue in range(QUEUES):
                    producer.send_async(name, payload, queue=queue)
            producer.flush()
            def rate(n: int, total: int) -> float:
                topics = names[:n]
                wait_until_idle(broker_pid)  # not the last pass's background work (warming, checkpoints)
                t0 = time.perf_counter()
                for i in range(total):
                    producer.send_async(topics[i % n], payload)
                producer.flush()
                return total / (time.perf_counter() - t0)

            for n in counts:  # a warm-up pass (routes, connections, pages), then the measured one
                rate(n, messages // 4)
                rates[n] = rate(n, messages)
            # one topic's pass lasts a fraction of a second: the ratio is the median of alternated passes
            passes = {1: [rates[1]], many: [rates[many]]}
            for _ in range(PRODUCE_ROUNDS - 1):
                for n in passes:
                    passes[n].append(rate(n, messages))
            rates |= {n: statistics.median(found) for n, found in passes.items()}
    figures: dict[str, float] = {f"send_async_msgs_per_s_{n}_topic{'s' if n > 1 else ''}": rates[n] for n in counts}
    figures["produce_topics"] = many
    figures["send_async_msgs_per_s_many_topics"] = rates[many]
    figures["send_async_many_topics_ratio"] = rates[many] / rates[1]
    return figures


def consume_rate(nameserver: str, group: str, topics: list[str], expected: int) -> tuple[float, float]:
    """(messages per second, seconds to join) of a fresh group subscribed to ``topics`` reading from
    the start until it has read ``expected`` messages (every one made and its body touched). As
    kafka-consumer-perf-test reports rebalance and fetch time apart, the rate is timed from the
    Consumer's creation returning (the group joined, its assignment known) to the last message."""
    from gms.client import Consumer

    t0 = time.perf_counter()
    seen = 0
    with Consumer(nameserver=nameserver, group=group, subscription=dict.fromkeys(topics, "*"),
                  start_from="first", auto_commit=False) as consumer:
        joined = time.perf_counter()
        end = time.monotonic() + CONSUME_TIMEOUT_S
        while seen < expected:
            if time.monotonic() > end:
                raise TimeoutError(f"group {group} read {seen} of {expected} messages")
            for message in consumer.poll(1000):
                seen += len(message.body) > 0
        elapsed = time.perf_counter() - joined
    if seen != expected:
        raise RuntimeError(f"group {group} read {seen} messages, {expected} were sent")
    return expected / elapsed, joined - t0


def scenario_consume(quick: bool) -> dict[str, float]:
    """A group subscribed to N topics of 4 queues (quick: 300, full: 1,000) against one topic: the
    same number of 100 B messages (quick: 100k, full: 1 M: 250 a queue, so a read lasts long enough
    that its join and first fetches are not most of it) produced beforehand (not timed), into
    one topic and round-robin over the N, then read by fresh groups from the start: CONSUME_ROUNDS
    of each, in turn (medians)."""
    from gms.client import Admin, Producer

    count = 300 if quick else 1000
    messages = 100_000 if quick else 1_000_000
    many = [f"c{i:05d}" for i in range(count)]
    with tempfile.TemporaryDirectory(prefix="bench-scale-consume-") as tmp, \
            gms_standalone(Path(tmp)) as (nameserver, _):
        with Admin(nameserver=nameserver) as admin:
            failed = [r for r in admin.create_topics([("one", QUEUES), *((t, QUEUES) for t in many)]) if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} topics not created, first: {failed[0]}")
        payload = os.urandom(PAYLOAD)
        with Producer(nameserver=nameserver) as producer:
            for i in range(messages):
                producer.send_async("one", payload)
                producer.send_async(many[i % count], payload)
            producer.flush()
        rounds = [(consume_rate(nameserver, f"g-one-{r}", ["one"], messages),
                   consume_rate(nameserver, f"g-many-{r}", many, messages)) for r in range(CONSUME_ROUNDS)]
    one, join_one = (statistics.median(found) for found in zip(*(pair[0] for pair in rounds), strict=True))
    spread, join_many = (statistics.median(found) for found in zip(*(pair[1] for pair in rounds), strict=True))
    return {"consume_topics": count, "consume_msgs_per_s_1_topic": one,
            "consume_msgs_per_s_many_topics": spread, "consume_many_topics_ratio": spread / one,
            "consume_join_s_1_topic": join_one, "consume_join_s_many_topics": join_many}


SCENARIOS: dict[str, Callable[[bool], dict[str, float]]] = {
    "produce": scenario_produce,
    "consume": scenario_consume,
    "control": scenario_control,
    "queues": scenario_queues,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (creation: 300 topics, full: 1,000)")
    parser.add_argument("--topics", type=int, help="the number of topics to create")
    parser.add_argument("--only", choices=["create", *SCENARIOS], help="run only this scenario")
    parser.add_argument("--produce-messages", type=int, metavar="N",
                        help="messages a produce pass sends (default 2,000,000; quick 600,000)")
    args = parser.parse_args()
    topics = args.topics or (300 if args.quick else 1000)
    figures = run(topics) if args.only in (None, "create") else {}
    for name, scenario in SCENARIOS.items():
        if args.only in (None, name):
            figures |= (scenario_produce(args.quick, args.produce_messages) if scenario is scenario_produce
                        else scenario(args.quick))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    sys.exit(main())
