"""Fault benchmark: rounds of random faults against real processes under continuous producers,
then every queue read back through the SDK and checked against what was acknowledged.

Two setups, one after the other, each a nameserver (embedded etcd) and its brokers on 127.0.0.1:

- ``single``: one broker, ``flush_mode = "sync"``, a topic of 2 queues, producers with acks=1
  (acknowledged = fsynced on the only replica);
- ``cluster``: 3 brokers, a topic of 3 queues with 3 replicas and ``min_insync_replicas`` 2,
  producers with acks=-1.

Producers are the public SDK (``gms.client.Producer`` through the nameserver, retries on): one
thread per queue sending single messages pinned to its queue (these time the unavailability)
and one thread sending unpinned batches of 10. A send counts as acknowledged only when the SDK
call returned. A live ``Consumer`` reads the topic from the first offset during the rounds.

Each round injects one fault, chosen with ``random.Random(--seed)``: the kinds are drawn as
shuffled blocks of all three, so every kind occurs once per three rounds.

- ``kill``: SIGKILL the leader of a random queue, restart it on the same port and store after a
  random 0.2 .. lease TTL + 1.5 s (a restart within the lease is the KIP-966 case);
- ``pause``: SIGSTOP the leader of a random queue for 3 × lease TTL + 2 .. + 4 s (long enough to
  tell a failover from waiting for the broker to come back), then SIGCONT;
- ``bitflip``: stop a random broker (SIGKILL or SIGTERM, at random), flip one random bit in the
  CRC-covered bytes (record offset 40 .. end: header fields, topic, host, body) of a random
  record of the topic among the older half of its commitlog, then restart it. The message hit
  is recorded: it is *deliberately damaged* and excluded from ``lost``.

After each round the benchmark waits until the setup has been whole again for a second (every
broker registered and caught up, every ISR full; ``settle_timeouts`` counts waits that gave up
after 30 s) and lets the producers run on. After the last round the producers stop, and a fresh consumer group reads
every queue from its first offset to the leader's max offset.

Every body is ``<message id>|<random payload>|<crc32 of the rest, 8 hex digits>``; the
benchmark keeps every body it sent. The one JSON line:

- ``rounds``: fault rounds run (both setups); ``acked``: messages acknowledged;
- ``lost``: acknowledged messages not read (as valid data) anywhere in the final read-back,
  the deliberately damaged ones excluded;
- ``dup_offsets``: distinct (topic, queue, offset) slots with a conflict: two different
  messages claimed it (two acknowledgements, an acknowledgement and a read, or two reads,
  live or final); or an acknowledged message was read, but not at the offset it was
  acknowledged with (the acknowledged slot counts); or it was read again at a higher offset of
  its queue than the acknowledged one (that slot counts: stored again after its ack). Copies
  at lower offsets (or in another queue, for unpinned batches) are what an SDK retry of a
  timed-out request leaves behind (at-least-once delivery); they are counted apart, in
  ``retry_dups``, and are not a conflict;
- ``corrupt_served``: records delivered as messages (live or final reads) whose CRC fails when
  checked on the client, whose body fails its checksum, or whose body differs from the body
  sent under its id;
- ``stuck_consumers``: consumers (the live one and the final reader of each setup) that, on
  some queue, made no progress for more than ``--stuck-s`` seconds while an acknowledged
  message at or past their position existed;
- ``broker_restarts_refused``: restarts after a fault where the broker exited or did not serve
  within 30 s (the rounds of that setup stop there; the broker log tail goes to stderr);
- ``max_unavailable_s``: the cluster's longest time, over all queues and rounds, between two
  acks=-1 acknowledgements of a queue's pinned producer, counted from the fault until the end
  of its round (target: lease TTL + 1 s, ``unavailable_target_s``);
- ``paused_leader_worst_gap_s``: the same over the queues a paused broker led, from the SIGSTOP
  until the end of its round (target: lease TTL + 1 s: a send in flight to the paused broker is
  given up once another broker leads its queue, not at the SDK's request timeout,
  ``--request-timeout-ms``, 30 s by default as in the SDK); ``paused_leader_gaps_s`` has one
  ``{queue: longest gap}`` per pause round of the cluster;

and for reference the seed, the lease TTL, ``sent``, ``damaged_deliberately``,
``damaged_reported`` (records the broker answered as damaged in the final reads),
``single_max_unavailable_s`` (the single broker is simply down while killed or paused),
``faults`` by kind and the elapsed time. Progress and details go to stderr.

    python benchmarks/bench_faults.py [--quick] [--seed 1] [--rounds N] [--lease-ttl-s 2]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isal.isal_zlib import crc32

from gms.client import Admin, Consumer, DamagedRecord, Producer, ProducerRecord
from gms.client.runtime import REQUEST_TIMEOUT_MS
from gms.cluster.etcd_client import EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.errors import GmsError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode
from gms.record import HEADER_SIZE, OFF_CRC_START, OFFSETS, RecordCheck, check_record, decode_record, scan_records

sys.path.insert(0, str(Path(__file__).parent))
from bench_procs import start_cluster, stop_servers

FAULT_KINDS = ("kill", "pause", "bitflip")
STORE_TOML = "[store]\ncommitlog_file_size_bytes = 67108864\ncq_entries_per_file = 20000\n"
SETTLE_TIMEOUT_S = 30.0
RESTART_TIMEOUT_S = 30.0
STABLE_S = 1.0
BATCH_MESSAGES = 10


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- message bodies --------------------------------------------------------------------------


def make_body(msg_id: str, rng: random.Random) -> bytes:
    content = msg_id.encode() + b"|" + rng.randbytes(rng.randint(16, 200))
    return content + b"|%08x" % crc32(content)


def body_id(body: bytes) -> str | None:
    """The message id of an intact body; None if its checksum fails."""
    content, sep, check = body[:-9], body[-9:-8], body[-8:]
    try:
        if sep != b"|" or int(check, 16) != crc32(content):
            return None
        return content.split(b"|", 1)[0].decode()
    except (ValueError, UnicodeDecodeError):
        return None


# --- what was sent, acknowledged and read ----------------------------------------------------


Slot = tuple[str, int, int]  # topic, queue id, queue offset


@dataclass
class Ledger:
    """Everything one setup sent, acknowledged and read; thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: dict[str, bytes] = field(default_factory=dict)
    acked: dict[str, Slot] = field(default_factory=dict)
    ack_of_slot: dict[Slot, str] = field(default_factory=dict)
    ack_times: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    acked_max: dict[tuple[str, int], int] = field(default_factory=dict)
    conflicts: set[Slot] = field(default_factory=set)
    read_of_slot: dict[Slot, str] = field(default_factory=dict)  # valid reads, live and final
    final_reads: dict[str, set[Slot]] = field(default_factory=lambda: defaultdict(set))
    corrupt_served: int = 0
    damaged_ids: set[str] = field(default_factory=set)
    damaged_reported: set[Slot] = field(default_factory=set)
    send_errors: int = 0
    frozen: bool = False

    def add_sent(self, msg_id: str, body: bytes) -> None:
        with self.lock:
            self.sent[msg_id] = body

    def ack(self, msg_id: str, slot: Slot, pinned: bool) -> None:
        now = time.monotonic()
        with self.lock:
            if self.frozen:
                return
            self.acked[msg_id] = slot
            other = self.ack_of_slot.setdefault(slot, msg_id)
            if other != msg_id:
                self.conflicts.add(slot)
                log(f"CONFLICT: {slot} acknowledged for {other} and for {msg_id}")
            queue = slot[:2]
            if pinned:
                self.ack_times[queue].append(now)
            self.acked_max[queue] = max(self.acked_max.get(queue, -1), slot[2])

    def read(self, message: Any, final: bool, who: str) -> None:
        """One message a consumer delivered: check it and remember where it was."""
        slot = (message.topic, message.queue_id, message.queue_offset)
        body = message.body
        msg_id = body_id(body)
        # The client-side CRC check of the served record, on the buffer the SDK fetched (the
        # SDK trusts a broker that says it checked): damage served as data is caught here.
        crc_ok = check_record(message.raw_record)[0] is RecordCheck.OK
        with self.lock:
            if not crc_ok or msg_id is None or self.sent.get(msg_id) != body:
                self.corrupt_served += 1
                log(f"CORRUPT SERVED to {who}: {slot} crc_ok={crc_ok} id={msg_id} body={body[:40]!r}")
                return
            other = self.read_of_slot.setdefault(slot, msg_id)
            if other != msg_id:
                self.conflicts.add(slot)
                log(f"CONFLICT: {slot} read as {other} and as {msg_id} ({who})")
            acked_here = self.ack_of_slot.get(slot)
            if acked_here is not None and acked_here != msg_id:
                self.conflicts.add(slot)
                log(f"CONFLICT: {slot} acknowledged for {acked_here}, read as {msg_id} ({who})")
            if final:
                self.final_reads[msg_id].add(slot)

    def damaged(self, record: DamagedRecord) -> None:
        with self.lock:
            self.damaged_reported.add((record.topic, record.queue_id, record.queue_offset))

    def verdict(self) -> dict[str, int]:
        with self.lock:
            lost = retry_dups = 0
            bad_slots = set(self.conflicts)
            for msg_id, slot in self.acked.items():
                found = self.final_reads.get(msg_id, set())
                if not found:
                    if msg_id not in self.damaged_ids:
                        lost += 1
                    continue
                if slot not in found:
                    if msg_id not in self.damaged_ids:
                        bad_slots.add(slot)
                        log(f"MOVED: {msg_id} acknowledged at {slot}, read at {sorted(found)}")
                    continue
                later = [s for s in found if s[:2] == slot[:2] and s[2] > slot[2]]
                if later:
                    bad_slots.update(later)
                    log(f"STORED AGAIN: {msg_id} acknowledged at {slot}, read again at {sorted(later)}")
                if len(found) - 1 - len(later):
                    log(f"RETRY COPY: {msg_id} acknowledged at {slot}, also read at {sorted(found - {slot})}")
                retry_dups += len(found) - 1 - len(later)
            return {"acked": len(self.acked), "sent": len(self.sent), "lost": lost, "dup_offsets": len(bad_slots),
                    "retry_dups": retry_dups, "corrupt_served": self.corrupt_served,
                    "damaged_deliberately": len(self.damaged_ids), "damaged_reported": len(self.damaged_reported),
                    "send_failures": self.send_errors}

    def lost_ids(self, limit: int = 20) -> list[tuple[str, Slot]]:
        with self.lock:
            return [(m, s) for m, s in self.acked.items()
                    if not self.final_reads.get(m) and m not in self.damaged_ids][:limit]


# --- producers and consumers -----------------------------------------------------------------


class Producing(threading.Thread):
    """Sends until stopped: pinned single messages to ``queue``, or unpinned batches (None)."""

    def __init__(self, name: str, nameserver: str, topic: str, queue: int | None, acks: int,
                 ledger: Ledger, seed: int, request_timeout_ms: float) -> None:
        super().__init__(name=name, daemon=True)
        self.nameserver, self.topic, self.queue, self.acks = nameserver, topic, queue, acks
        self.request_timeout_ms = request_timeout_ms
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.stopping = threading.Event()

    def run(self) -> None:
        with Producer(nameserver=self.nameserver, acks=self.acks, retries=100_000, retry_backoff_ms=10,
                      linger_ms=0, request_timeout_ms=self.request_timeout_ms) as producer:
            seq = itertools.count()
            while not self.stopping.is_set():
                count = 1 if self.queue is not None else BATCH_MESSAGES
                ids = [f"{self.name}-{next(seq)}" for _ in range(count)]
                bodies = [make_body(i, self.rng) for i in ids]
                for msg_id, body in zip(ids, bodies, strict=True):
                    self.ledger.add_sent(msg_id, body)
                try:
                    if self.queue is not None:
                        results = [producer.send(self.topic, bodies[0], queue=self.queue)]
                    else:
                        results = list(producer.send_batch([ProducerRecord(self.topic, b) for b in bodies]))
                except (GmsError, TimeoutError) as err:
                    self.ledger.send_errors += 1
                    log(f"{self.name}: send failed after the SDK's retries: {err!r}")
                    continue
                pinned = self.queue is not None
                for msg_id, result in zip(ids, results, strict=True):
                    self.ledger.ack(msg_id, (result.topic, result.queue_id, result.queue_offset), pinned)

    def stop(self) -> None:
        self.stopping.set()


class Progress:
    """Positions of one consumer per queue, and whether it stalled while it had work."""

    def __init__(self, name: str, ledger: Ledger, stuck_s: float) -> None:
        self.name, self.ledger, self.stuck_s = name, ledger, stuck_s
        self.lock = threading.Lock()
        self.positions: dict[tuple[str, int], int] = {}
        self.last_progress: dict[tuple[str, int], float] = {}
        self.started = time.monotonic()
        self.stuck: list[str] = []

    def update(self, positions: dict[tuple[str, int], int]) -> None:
        now = time.monotonic()
        with self.lock:
            for queue, pos in positions.items():
                if self.positions.get(queue) != pos:
                    self.positions[queue] = pos
                    self.last_progress[queue] = now

    def check(self, queues: Iterable[tuple[str, int]]) -> None:
        """Record a stall: no progress on a queue for > stuck_s although an acked message waits."""
        now = time.monotonic()
        with self.lock:
            for queue in queues:
                pos = self.positions.get(queue, 0)
                waiting = self.ledger.acked_max.get(queue, -1) >= pos
                last = self.last_progress.get(queue, self.started)
                if not waiting:
                    self.last_progress[queue] = now
                elif now - last > self.stuck_s:
                    self.stuck.append(f"{self.name} {queue} at {pos} for {now - last:.1f} s "
                                      f"(acked up to {self.ledger.acked_max.get(queue)})")
                    log(f"STUCK: {self.stuck[-1]}")
                    self.last_progress[queue] = now  # one report per stall


def consumer_positions(consumer: Consumer, queues: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    found = {}
    for topic, q in queues:
        pos = consumer.position(topic, q)
        if pos is not None:
            found[(topic, q)] = pos
    return found


class LiveConsumer(threading.Thread):
    """A consumer of its own group reading from the first offset while the faults happen."""

    def __init__(self, nameserver: str, topic: str, queues: int, ledger: Ledger, progress: Progress,
                 request_timeout_ms: float) -> None:
        super().__init__(name=f"live-{topic}", daemon=True)
        self.nameserver, self.topic, self.ledger, self.progress = nameserver, topic, ledger, progress
        self.request_timeout_ms = request_timeout_ms
        self.queues = [(topic, q) for q in range(queues)]
        self.stopping = threading.Event()
        self.received = 0

    def run(self) -> None:
        with Consumer(nameserver=self.nameserver, group=f"live-{self.topic}", subscription={self.topic: "*"},
                      start_from="first", on_damaged=self.ledger.damaged,
                      request_timeout_ms=self.request_timeout_ms) as consumer:
            while not self.stopping.is_set():
                try:
                    for message in consumer.poll(200):
                        self.ledger.read(message, final=False, who=self.name)
                        self.received += 1
                except Exception as err:  # noqa: BLE001 - reported; the stall detector judges
                    log(f"{self.name}: poll failed: {err!r}")
                    time.sleep(0.2)
                self.progress.update(consumer_positions(consumer, self.queues))


class Watchdog(threading.Thread):
    def __init__(self, progress: Progress, queues: list[tuple[str, int]]) -> None:
        super().__init__(daemon=True)
        self.progress, self.queues = progress, queues
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.25):
            self.progress.check(self.queues)


def read_back(nameserver: str, topic: str, queues: int, ledger: Ledger, stuck_s: float) -> Progress:
    """Read every queue from its first offset to the leader's max offset with a fresh group."""
    with Admin(nameserver=nameserver) as admin:
        ends = {(topic, s["queue_id"]): s["max_offset"] for s in admin.topic_stats(topic)}
    log(f"read-back of {topic}: leader max offsets {ends}, acked max {dict(ledger.acked_max)}")
    progress = Progress(f"final-{topic}", ledger, stuck_s)
    targets = [(topic, q) for q in range(queues)]
    with Consumer(nameserver=nameserver, group=f"verify-{topic}", subscription={topic: "*"}, start_from="first",
                  on_damaged=ledger.damaged, auto_commit=False, request_timeout_ms=1000) as consumer:
        while True:
            try:
                for message in consumer.poll(200):
                    ledger.read(message, final=True, who=progress.name)
            except GmsError as err:
                log(f"read-back poll failed: {err!r}")
                time.sleep(0.2)
            positions = consumer_positions(consumer, targets)
            progress.update(positions)
            if all(positions.get(q, -1) >= ends.get(q, 0) for q in targets):
                return progress
            now = time.monotonic()
            stalled = [q for q in targets if positions.get(q, -1) < ends.get(q, 0)
                       and now - progress.last_progress.get(q, progress.started) > stuck_s]
            if stalled:
                progress.stuck.append(f"{progress.name} {stalled} at {[positions.get(q) for q in stalled]}, "
                                      f"ends {[ends.get(q) for q in stalled]}")
                log(f"STUCK: {progress.stuck[-1]}")
                return progress


# --- processes -------------------------------------------------------------------------------


@dataclass
class Broker:
    name: str  # b0, b1, ...: its store is root/name, its log root/name.log
    address: str
    proc: subprocess.Popen[bytes]
    paused: bool = False

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


class Setup:
    """A nameserver and its brokers under ``root``; restarts keep each broker's port."""

    def __init__(self, name: str, root: Path, broker_toml: str, brokers: int, queues: int, replicas: int,
                 acks: int, args: argparse.Namespace) -> None:
        self.name, self.root, self.queues, self.acks, self.args = name, root, queues, acks, args
        self.topic = f"faults-{name}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ledger = Ledger()
        self.restarts_refused = 0
        self.settle_timeouts = 0
        self.faults: Counter[str] = Counter()
        self.unavailable: list[tuple[str, float]] = []  # (fault kind, longest gap of its round)
        self.paused_gaps: list[dict[int, float]] = []  # per pause round: queue the paused broker led -> gap
        root.mkdir()
        self.nameserver, by_address = start_cluster(root, self.procs, broker_toml, brokers)
        self.brokers = [Broker(f"b{i}", a, p) for i, (a, p) in enumerate(by_address.items())]
        self.etcd = self._etcd()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while len(self.admin_call(lambda a: a.brokers())) < brokers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: brokers did not register")
            time.sleep(0.1)
        settings = {"min_insync_replicas": 2} if replicas > 1 else {}
        self.admin_call(lambda a: a.create_topic(self.topic, queues, replicas=replicas, settings=settings))
        self.settle()

    def _etcd(self) -> ClusterMetadata:
        async def ask() -> dict[str, Any]:
            host, port = self.nameserver.rsplit(":", 1)
            conn = await Connection.open(host, int(port))
            try:  # what brokers ask first: where etcd is (read-only)
                return dict((await conn.request(RequestCode.REGISTER_BROKER, {})).fields)
            finally:
                conn.close()

        fields = run(ask())
        return ClusterMetadata(EtcdClient(fields["etcd"]), fields["prefix"])

    def admin_call(self, call: Any) -> Any:
        with Admin(nameserver=self.nameserver) as admin:
            return call(admin)

    def whole(self) -> bool:
        live = {b.address: b for b in self.etcd.live_brokers()}
        if len(live) < len(self.brokers) or not all(b.caught_up for b in live.values()):
            return False
        topic = self.etcd.get_topic(self.topic)
        return all(q.leader is not None and len(q.isr) == len(q.replicas) for q in topic.queues)

    def settle(self) -> float:
        """Wait until the setup has been whole for a second on end (a dead broker may still be
        in the ISRs just after a fault)."""
        started = time.monotonic()
        whole_since: float | None = None
        while True:
            try:
                if not self.whole():
                    whole_since = None
                elif whole_since is None:
                    whole_since = time.monotonic()
                elif time.monotonic() - whole_since >= STABLE_S:
                    return whole_since - started
            except Exception as err:  # noqa: BLE001 - etcd answers again once the cluster is back
                whole_since = None
                log(f"{self.name}: state read failed: {err!r}")
            if time.monotonic() - started > SETTLE_TIMEOUT_S:
                self.settle_timeouts += 1
                log(f"{self.name}: not whole after {SETTLE_TIMEOUT_S} s")
                return time.monotonic() - started
            time.sleep(0.1)

    def queues_led_by(self, broker: Broker) -> list[int]:
        by_id = {b.broker_id: b.address for b in self.etcd.live_brokers()}
        queues = self.etcd.get_topic(self.topic).queues
        return [q.queue_id for q in queues if by_id.get(q.leader or "") == broker.address]

    def leader_of_random_queue(self, rng: random.Random) -> tuple[int, Broker]:
        topic = self.etcd.get_topic(self.topic)
        queue = rng.randrange(self.queues)
        leader = topic.queues[queue].leader
        by_id = {b.broker_id: b.address for b in self.etcd.live_brokers()}
        address = by_id.get(leader or "")
        for broker in self.brokers:
            if broker.address == address:
                return queue, broker
        return queue, rng.choice(self.brokers)  # no live leader known: any broker

    def restart(self, broker: Broker) -> bool:
        """Start ``broker`` again on its port and store; False (and its log tail) if it refuses."""
        port_file, log_path = self.root / f"{broker.name}.port", self.root / f"{broker.name}.log"
        port_file.unlink(missing_ok=True)
        with open(log_path, "ab") as out:
            out.write(f"\n=== bench_faults: restart at {time.strftime('%H:%M:%S')} ===\n".encode())
            out.flush()
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "gms.broker", "--listen", broker.address, "--log-level", "warning",
                 "--store-dir", str(self.root / broker.name), "--nameserver", self.nameserver,
                 "--config", str(self.root / f"{broker.name}.toml"), "--port-file", str(port_file)],
                stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        broker.proc = proc
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
                self.restarts_refused += 1
                tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                log(f"RESTART REFUSED: {self.name} {broker.name} ({broker.address}), exit {proc.returncode}; "
                    f"log tail:\n{tail}")
                return False
            time.sleep(0.05)
        return True

    def resume_all(self) -> None:
        for broker in self.brokers:
            if broker.paused and broker.proc.poll() is None:
                os.kill(broker.proc.pid, signal.SIGCONT)
                broker.paused = False

    def stop(self) -> None:
        self.resume_all()
        try:
            self.etcd.client.close()
        except Exception:  # noqa: BLE001 - the processes must stop anyway
            pass
        stop_servers(self.procs)


def fault_plan(rng: random.Random, rounds: int) -> list[str]:
    plan: list[str] = []
    while len(plan) < rounds:
        plan.extend(rng.sample(FAULT_KINDS, len(FAULT_KINDS)))
    return plan[:rounds]


def field_at(record_bytes: bytes, offset: int) -> str:
    """Which field of a record holds byte ``offset``."""
    if offset < HEADER_SIZE:
        return max((o, n) for n, o in OFFSETS.items() if o <= offset)[1]
    lengths = [record_bytes[OFFSETS["topic_len"]], record_bytes[OFFSETS["tag_len"]],
               record_bytes[OFFSETS["born_host_len"]],
               int.from_bytes(record_bytes[OFFSETS["keys_len"]:OFFSETS["keys_len"] + 2], "big"),
               int.from_bytes(record_bytes[OFFSETS["props_len"]:OFFSETS["props_len"] + 2], "big")]
    pos = HEADER_SIZE
    for name, length in zip(("topic", "tag", "born_host", "keys", "properties"), lengths, strict=True):
        if offset < pos + length:
            return name
        pos += length
    return "body"


def flip_old_record(store_dir: Path, topic: str, rng: random.Random) -> tuple[str, str] | None:
    """Flip one bit in the CRC-covered bytes of a random intact record of ``topic`` among the
    older half of the commitlog of a stopped broker; (message id, description) of the hit."""
    records: list[tuple[Path, int, int, str]] = []
    for path in sorted((store_dir / "store" / "commitlog").iterdir()):
        data = path.read_bytes()
        for start in scan_records(data, verify_crc=False).starts:
            try:
                record = decode_record(data, start)  # CRC checked: never hit a record twice
            except Exception:  # noqa: BLE001 - an already damaged record is no candidate
                continue
            msg_id = body_id(bytes(record.body))
            if record.topic == topic and msg_id is not None:
                records.append((path, start, record.total_size, msg_id))
    if not records:
        return None
    path, start, size, msg_id = rng.choice(records[: max(1, len(records) // 2)])
    offset = rng.randrange(OFF_CRC_START, size)
    bit = rng.randrange(8)
    with open(path, "r+b") as fh:
        fh.seek(start)
        record_bytes = fh.read(size)
        fh.seek(start + offset)
        fh.write(bytes([record_bytes[offset] ^ (1 << bit)]))
        fh.flush()
        os.fsync(fh.fileno())
    queue_id = int.from_bytes(record_bytes[OFFSETS["queue_id"]:OFFSETS["queue_id"] + 4], "big")
    queue_offset = int.from_bytes(record_bytes[OFFSETS["queue_offset"]:OFFSETS["queue_offset"] + 8], "big")
    return msg_id, (f"{msg_id} at {topic}/{queue_id}@{queue_offset} ({path.name}+{start}), byte {offset} "
                    f"({field_at(record_bytes, offset)}) bit {bit}")


def longest_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(points))


def run_round(setup: Setup, index: int, kind: str, rng: random.Random, steady_s: float) -> bool:
    """One fault and the recovery after it; False when a broker refused to restart."""
    ttl = setup.args.lease_ttl_s
    queue, leader = setup.leader_of_random_queue(rng)
    started = time.monotonic()
    ok = True
    setup.faults[kind] += 1
    if kind == "kill":
        delay = rng.uniform(0.2, ttl + 1.5)
        log(f"{setup.name} round {index}: SIGKILL {leader.name} ({leader.address}, leader of queue {queue}), "
            f"restart after {delay:.1f} s")
        leader.proc.kill()
        leader.proc.wait()
        time.sleep(delay)
        ok = setup.restart(leader)
    elif kind == "pause":
        pause = rng.uniform(3 * ttl + 2, 3 * ttl + 4)
        led = setup.queues_led_by(leader)
        log(f"{setup.name} round {index}: SIGSTOP {leader.name} ({leader.address}, leader of queue {queue}) "
            f"for {pause:.1f} s")
        os.kill(leader.proc.pid, signal.SIGSTOP)
        leader.paused = True
        time.sleep(pause)
        os.kill(leader.proc.pid, signal.SIGCONT)
        leader.paused = False
    else:
        victim = rng.choice(setup.brokers)
        how = rng.choice(("SIGKILL", "SIGTERM"))
        victim.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        try:
            victim.proc.wait(20)
        except subprocess.TimeoutExpired:
            victim.proc.kill()
            victim.proc.wait()
        hit = flip_old_record(setup.root / victim.name, setup.topic, rng)
        if hit is not None:
            setup.ledger.damaged_ids.add(hit[0])
        log(f"{setup.name} round {index}: {how} {victim.name} ({victim.address}), bit flip in "
            f"{hit[1] if hit else 'nothing (no record yet)'}, restart")
        ok = setup.restart(victim)
    if ok:
        log(f"{setup.name} round {index}: whole again after {setup.settle():.1f} s")
    time.sleep(steady_s)
    ended = time.monotonic()
    with setup.ledger.lock:
        gaps = {q: longest_gap(list(times), started, ended) for q, times in setup.ledger.ack_times.items()}
    longest = max(gaps.values(), default=ended - started)
    setup.unavailable.append((kind, longest))
    if kind == "pause":
        setup.paused_gaps.append({q: round(gaps.get((setup.topic, q), ended - started), 2) for q in led})
        log(f"{setup.name} round {index}: longest time without an ack on the queues the paused broker led "
            f"{setup.paused_gaps[-1]}")
    log(f"{setup.name} round {index}: longest time without an ack per queue "
        f"{ {q[1]: round(g, 2) for q, g in sorted(gaps.items())} }")
    return ok


def run_setup(setup: Setup, rounds: int, rng: random.Random, seed: int, steady_s: float) -> dict[str, Any]:
    ledger = setup.ledger
    queues = [(setup.topic, q) for q in range(setup.queues)]
    timeout_ms = setup.args.request_timeout_ms
    producers = [Producing(f"{setup.name[0]}{q}", setup.nameserver, setup.topic, q, setup.acks, ledger,
                           seed * 100 + q, timeout_ms) for q in range(setup.queues)]
    producers.append(Producing(f"{setup.name[0]}b", setup.nameserver, setup.topic, None, setup.acks, ledger,
                               seed * 100 + 99, timeout_ms))
    progress = Progress(f"live-{setup.topic}", ledger, setup.args.stuck_s)
    live = LiveConsumer(setup.nameserver, setup.topic, setup.queues, ledger, progress, timeout_ms)
    watchdog = Watchdog(progress, queues)
    threads: list[Any] = [*producers, live, watchdog]
    for thread in threads:
        thread.start()
    done = 0
    try:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while len(ledger.acked) < 100 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(steady_s)
        for index, kind in enumerate(fault_plan(rng, rounds)):
            done += 1
            if not run_round(setup, index, kind, rng, steady_s):
                log(f"{setup.name}: a broker refused to restart; no more rounds here")
                break
    finally:
        for producer in producers:
            producer.stop()
        for producer in producers:
            producer.join(60)
        with ledger.lock:
            ledger.frozen = True  # a send still retrying past this is not counted as acknowledged
        time.sleep(1.0)  # the live consumer catches up with the last sends
        live.stopping.set()
        live.join(30)
        watchdog.stopping.set()
        watchdog.join(5)
    log(f"{setup.name}: {len(ledger.acked)} acked, {len(ledger.sent)} sent, live consumer received {live.received}")
    setup.settle()
    final = read_back(setup.nameserver, setup.topic, setup.queues, ledger, setup.args.stuck_s)
    result = ledger.verdict()
    result["rounds"] = done
    result["stuck_consumers"] = int(bool(progress.stuck)) + int(bool(final.stuck))
    if result["lost"]:
        log(f"{setup.name}: LOST (first 20): {ledger.lost_ids()}")
    log(f"{setup.name}: {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="6 rounds per setup (whole benchmark <= 180 s)")
    parser.add_argument("--rounds", type=int, help="fault rounds per setup (default 6 with --quick, else 15)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lease-ttl-s", type=int, default=2)
    parser.add_argument("--request-timeout-ms", type=float, default=REQUEST_TIMEOUT_MS,
                        help="the producers' and the live consumer's SDK request timeout (default: the SDK's)")
    parser.add_argument("--stuck-s", type=float, default=10.0,
                        help="a consumer with work that makes no progress this long is stuck")
    args = parser.parse_args()
    rounds = args.rounds if args.rounds is not None else (6 if args.quick else 15)
    steady_s = 1.5 if args.quick else 4.0
    rng = random.Random(args.seed)
    started = time.monotonic()
    broker_section = f"[broker]\nlease_ttl_s = {args.lease_ttl_s}\n"
    results: dict[str, dict[str, Any]] = {}
    setups: dict[str, Setup] = {}
    with tempfile.TemporaryDirectory(prefix="gms-bench-faults-") as tmp:
        root = Path(tmp)
        for name, brokers, queues, replicas, acks, store in (
                ("single", 1, 2, 1, 1, 'flush_mode = "sync"\n'),
                ("cluster", 3, 3, 3, -1, "")):
            setup = None
            try:
                setup = Setup(name, root / name, broker_section + STORE_TOML + store, brokers, queues, replicas,
                              acks, args)
                setups[name] = setup
                results[name] = run_setup(setup, rounds, rng, args.seed, steady_s)
            finally:
                if setup is not None:
                    setup.stop()
    total = {key: sum(r[key] for r in results.values())
             for key in ("rounds", "acked", "sent", "lost", "dup_offsets", "retry_dups", "corrupt_served",
                         "stuck_consumers", "damaged_deliberately", "damaged_reported", "send_failures")}
    cluster, single = setups["cluster"], setups["single"]
    print(json.dumps({
        "seed": args.seed,
        "rounds": total["rounds"],
        "acked": total["acked"],
        "lost": total["lost"],
        "dup_offsets": total["dup_offsets"],
        "corrupt_served": total["corrupt_served"],
        "stuck_consumers": total["stuck_consumers"],
        "broker_restarts_refused": single.restarts_refused + cluster.restarts_refused,
        "max_unavailable_s": round(max((g for _, g in cluster.unavailable), default=0.0), 2),
        "unavailable_target_s": args.lease_ttl_s + 1,
        "lease_ttl_s": args.lease_ttl_s,
        "request_timeout_ms": args.request_timeout_ms,
        "paused_leader_worst_gap_s": round(max((g for r in cluster.paused_gaps for g in r.values()), default=0.0), 2),
        "paused_leader_gaps_s": cluster.paused_gaps,
        "max_unavailable_s_by_fault": {kind: round(max(g for k, g in cluster.unavailable if k == kind), 2)
                                       for kind in sorted({k for k, _ in cluster.unavailable})},
        "sent": total["sent"],
        "retry_dups": total["retry_dups"],
        "send_failures": total["send_failures"],
        "damaged_deliberately": total["damaged_deliberately"],
        "damaged_reported": total["damaged_reported"],
        "single_max_unavailable_s": round(max((g for _, g in single.unavailable), default=0.0), 2),
        "settle_timeouts": single.settle_timeouts + cluster.settle_timeouts,
        "faults": {name: dict(s.faults) for name, s in setups.items()},
        "elapsed_s": round(time.monotonic() - started, 1),
    }))


if __name__ == "__main__":
    main()
