"""What security costs a client: TLS + SCRAM + ACLs against plaintext, and the per-request check.

Two questions, two kinds of measurement:

1. **Throughput over TLS** (``tls_produce_ratio``, ``tls_consume_ratio`` = secured / plaintext,
   target ≥ 0.7). The public path, exactly as a user runs it: ``gms standalone`` (plaintext) and
   ``gms standalone --secure`` (TLS with its development CA, SCRAM authentication, ACLs; the client
   is its ``admin`` super user, whose CA and password file the banner names), each on free loopback
   ports in a fresh data dir, started one after the other (never both at once), driven through the
   SDK with ``security=ClientSecurity(TlsFiles(ca), "admin", password)`` or ``ClientSecurity()``.
   Per mode: a 1-queue topic, N messages of 100 random bytes produced with ``send_batch`` of 1,000
   records (bench_peers W1), then a ``Consumer(group, start_from="first")`` that reads every
   message's topic, tag, keys and body until N are consumed; msg/s of each, with the client's and
   the broker's CPU (100 = one core). Then ``producer.send(topic, 100 B)`` one at a time, each
   waiting for its acknowledgement: p50 in µs (``plain_send_p50_us``, ``secured_send_p50_us``; the
   difference includes TLS record overhead on both ends and is informational).

2. **Authorisation per request once authenticated** (``auth_overhead_us``, target ≤ 5 µs).
   Authentication is SCRAM once per connection, so what every later request pays is the code the
   security work added to the request path, measured in-process (deterministic, no sockets): a
   ``BrokerAccess`` over an ``Authorizer`` whose ACL table holds 50 rules (literal and prefix, for
   the user, for ``*`` and for other users), principal ``normal:alice``, allowed publish/subscribe
   on topic ``orders`` and subscribe on group ``g1``:

   - PULL: the listener's ``access.authorize(principal, frame)`` (topic subscribe + group
     subscribe) and ``current_principal.set(principal)``;
   - SEND: ``access.authorize(principal, frame)`` (a SEND_BATCH frame: checked in the handler),
     ``current_principal.set(principal)``, the handler's ``access.check_topics("publish")`` and the
     store's call of that ``admit`` hook with ``[("orders", 0)]``.

   Each timed with ``timeit`` (best of several repeats); ``auth_overhead_us`` is the larger of the
   two requests' totals, and every part is reported too (``auth_*_us``).

Prints one JSON line (progress goes to stderr). Medians of ``--reps`` repetitions, the two modes
alternating in order rep by rep (plaintext first in even reps) so the machine's drift hits both;
``*_runs`` lists every repetition.

    python benchmarks/bench_security.py [--quick] [--reps K]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_peers import START_TIMEOUT_S, Deadline, Phase, _child_pid, pct, stop_process

FULL = {"n": 3_000_000, "nlat": 20_000, "warmup": 1_000}  # consume phases under a second are noise
QUICK = {"n": 100_000, "nlat": 2_000, "warmup": 300}
PIPE = 1000  # records per send_batch
SIZE = 100  # bytes per message body
PHASE_TIMEOUT_S = 600
TOPIC_SETTLE_S = 0.5  # a new topic reaches the broker through etcd: keep that out of the timings
MODES = ("plain", "secured")
ACL_RULES = 50
TIMEIT_NUMBER = 20_000
TIMEIT_REPEAT = 7


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --- the standalone, plaintext or secured ----------------------------------------------------------


@dataclass(frozen=True)
class Standalone:
    nameserver: str
    broker_pid: int
    ca_path: str = ""  # secured only
    password: str = ""


def _log_tails(data_dir: Path, lines: int = 30) -> str:
    out = []
    for path in sorted((data_dir / "logs").glob("*")):
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        out.append(f"--- {path} ---\n" + "\n".join(tail))
    return "\n".join(out)


@contextmanager
def gms_standalone(data_dir: Path, secure: bool) -> Iterator[Standalone]:
    """``gms standalone [--secure]`` on free ports in ``data_dir`` (bench_peers' variant with
    ``--secure``: the CA and the admin password come from the banner)."""
    gms = str(Path(sys.executable).parent / "gms")
    argv = [gms, "standalone", "--data-dir", str(data_dir), "--nameserver-port", "0", "--broker-port", "0",
            "--nameserver-metrics-port", "0", "--broker-metrics-port", "0", "--console-port", "0", "--kafka-port", "0",
            "--commitlog-file-size", str(1 << 30),  # the broker default, as measured before (not standalone's)
            "--log-level", "warning", *(["--secure"] if secure else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        banner, end = "", time.monotonic() + START_TIMEOUT_S
        last = "  clients " if secure else "  data "
        while last not in banner:
            line = proc.stdout.readline()
            if not line or time.monotonic() > end:
                stop_process(proc)
                raise RuntimeError(f"gms standalone{' --secure' if secure else ''} did not start "
                                   f"(exit {proc.poll()}):\n{banner}\n{_log_tails(data_dir)}")
            banner += line
        nameserver = re.search(r"nameserver\s+(\S+)", banner)
        if nameserver is None:
            raise RuntimeError(f"no nameserver address in the banner:\n{banner}")
        ca_path = password = ""
        if secure:
            ca = re.search(r"GMS_TLS_CA=(\S+)", banner)
            password_file = re.search(r"GMS_PASSWORD=\$\(cat (\S+?)\)", banner)
            if ca is None or password_file is None:
                raise RuntimeError(f"no CA or password file in the banner:\n{banner}")
            ca_path, password = ca.group(1), Path(password_file.group(1)).read_text().strip()
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # never block on a full pipe
        yield Standalone(nameserver.group(1), _child_pid(proc.pid, b"gms.broker"), ca_path, password)
    finally:
        stop_process(proc)


# --- one mode's workload ---------------------------------------------------------------------------


def mode_rep(server: Standalone, mode: str, sizes: dict[str, int]) -> dict[str, float]:
    """Produce, consume and single-send latency of one mode, through the SDK."""
    from gms.client import Admin, Consumer, Producer, ProducerRecord
    from gms.security.client import ClientSecurity
    from gms.security.tls import TlsFiles

    security = ClientSecurity(TlsFiles(server.ca_path), "admin", server.password) if mode == "secured" \
        else ClientSecurity()
    ns, n = server.nameserver, sizes["n"]
    figures: dict[str, float] = {}
    with Admin(nameserver=ns, security=security) as admin, Producer(nameserver=ns, security=security) as producer:
        topic = "bench-security"
        admin.create_topic(topic, queues=1)
        time.sleep(TOPIC_SETTLE_S)
        batch = [ProducerRecord(topic, os.urandom(SIZE))] * PIPE
        dl = Deadline(PHASE_TIMEOUT_S, f"{mode} produce/consume")
        with Phase(server.broker_pid) as produce:
            sent = 0
            while sent < n:
                dl.check()
                k = min(PIPE, n - sent)
                assert len(producer.send_batch(batch[:k])) == k
                sent += k
        got = nbytes = 0
        with Consumer(nameserver=ns, group="bench-security-g", subscription={topic: "*"}, start_from="first",
                      security=security) as consumer, Phase(server.broker_pid) as consume:
            while got < n:
                dl.check()
                messages = consumer.poll(timeout_ms=5000)
                for message in messages:  # every field a consumer routes on, and the body
                    if message.topic != topic or message.tag is not None or message.keys:
                        raise AssertionError(f"unexpected message {message!r}")
                    nbytes += len(message.body)
                got += len(messages)
        assert got == n and nbytes == n * SIZE, (got, nbytes)
        figures.update({
            f"{mode}_produce_msgs_per_s": n / produce.seconds, f"{mode}_consume_msgs_per_s": n / consume.seconds,
            f"{mode}_produce_cpu_client_pct": produce.client_pct, f"{mode}_produce_cpu_server_pct": produce.server_pct,
            f"{mode}_consume_cpu_client_pct": consume.client_pct, f"{mode}_consume_cpu_server_pct": consume.server_pct,
        })

        payload = os.urandom(SIZE)
        for _ in range(sizes["warmup"]):
            producer.send(topic, payload)
        dl = Deadline(PHASE_TIMEOUT_S, f"{mode} send latency")
        clock, lat = time.perf_counter_ns, []
        for i in range(sizes["nlat"]):
            if not i & 1023:
                dl.check()
            t0 = clock()
            producer.send(topic, payload)
            lat.append(clock() - t0)
        lat.sort()
        figures[f"{mode}_send_p50_us"] = pct(lat, 50) / 1e3
        figures[f"{mode}_send_p99_us"] = pct(lat, 99) / 1e3
    return figures


# --- the per-request authorisation, in-process -----------------------------------------------------


def acl_table() -> Any:
    """50 rules: alice's literal allows on orders / g1, prefix rules of hers that miss ``orders``
    (so every decision scans them), ``*`` rules, and other users' rules."""
    from gms.security.acl import AclRule, AclTable

    rules = [AclRule("alice", "topic", "orders", "publish"), AclRule("alice", "topic", "orders", "subscribe"),
             AclRule("alice", "group", "g1", "subscribe")]
    rules += [AclRule("alice", "topic", f"team{i}.", "all", "prefix") for i in range(8)]
    rules += [AclRule("alice", "group", f"grp{i}-", "subscribe", "prefix") for i in range(4)]
    rules += [AclRule("alice", "topic", "orders-secret", "all", permission="deny"),
              AclRule("*", "topic", "public.", "subscribe", "prefix"),
              AclRule("*", "topic", "audit.", "describe", "prefix"),
              AclRule("*", "cluster", "*", "describe")]
    users = ("bob", "carol", "dave", "erin", "frank", "grace")
    i = 0
    while len(rules) < ACL_RULES:
        user = users[i % len(users)]
        rules.append(AclRule(user, "topic", f"orders{i}" if i % 2 else f"svc{i}.", "publish",
                             "literal" if i % 2 else "prefix"))
        i += 1
    table = AclTable(rules)
    assert len(table) == ACL_RULES, len(table)
    return table


def best_us(stmt: str, namespace: dict[str, Any]) -> float:
    """Per-call µs of ``stmt``: the best of ``TIMEIT_REPEAT`` runs of ``TIMEIT_NUMBER`` calls."""
    timer = timeit.Timer(stmt, globals=namespace)
    return min(timer.repeat(TIMEIT_REPEAT, TIMEIT_NUMBER)) / TIMEIT_NUMBER * 1e6


def auth_figures() -> dict[str, float]:
    from gms.broker.access import BrokerAccess
    from gms.errors import ForbiddenError
    from gms.protocol.codes import RequestCode
    from gms.protocol.frame import Frame
    from gms.security.authorizer import Authorizer
    from gms.security.gate import current_principal
    from gms.security.users import Principal

    table = acl_table()
    access = BrokerAccess(Authorizer(lambda: table, ()))
    principal = Principal("alice", "normal")
    pull = Frame(code=RequestCode.PULL, request_id=1, fields={"topic": "orders", "queue_id": 0, "offset": 0,
                                                              "group": "g1"})
    send = Frame(code=RequestCode.SEND_BATCH, request_id=1, fields={"acks": 1})
    queues = [("orders", 0)]

    # The checks are real: what the rules do not allow is refused.
    current_principal.set(principal)
    for refused in (lambda: access.authorize(principal, pull._replace(fields={**pull.fields, "topic": "other"})),
                    lambda: access.authorize(principal, pull._replace(fields={**pull.fields, "group": "g2"})),
                    lambda: access.check_topics("publish")([("orders-secret", 0)]),
                    lambda: access.check_topics("publish")([("team1.x", 0), ("other", 0)])):
        try:
            refused()
        except ForbiddenError:
            continue
        raise AssertionError("a request the ACLs do not allow was let through")
    access.authorize(principal, pull)
    access.authorize(principal, send)
    access.check_topics("publish")(queues)
    current_principal.set(None)

    current_principal.set(principal)  # as the listener leaves it for the handler
    ns = {"check_topics": access.check_topics, "authorize": access.authorize, "set_principal": current_principal.set,
          "admit": access.check_topics("publish"), "p": principal, "pull": pull, "send": send, "queues": queues}
    parts = {
        "auth_pull_authorize_us": best_us("authorize(p, pull)", ns),
        "auth_send_authorize_us": best_us("authorize(p, send)", ns),
        "auth_set_principal_us": best_us("set_principal(p)", ns),
        "auth_check_topics_us": best_us("check_topics('publish')", ns),
        "auth_admit_us": best_us("admit(queues)", ns),
        "auth_pull_total_us": best_us("set_principal(p); authorize(p, pull)", ns),
        "auth_send_total_us": best_us("authorize(p, send); set_principal(p); check_topics('publish')(queues)", ns),
        "auth_timeit_loop_us": best_us("pass", ns),  # timeit's own loop, included in every figure above
    }
    current_principal.set(None)
    parts["auth_overhead_us"] = max(parts["auth_pull_total_us"], parts["auth_send_total_us"])
    return parts


# --- the run ---------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100k messages, 2k latency samples, 1 rep")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 1 with --quick, else 3)")
    args = ap.parse_args()
    sizes = QUICK if args.quick else FULL
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)

    log("auth: in-process per-request authorisation")
    auth = auth_figures()
    log("auth: " + json.dumps({k: round(v, 3) for k, v in auth.items()}))

    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        for rep in range(reps):
            figures: dict[str, float] = {}
            for mode in MODES if rep % 2 == 0 else tuple(reversed(MODES)):
                log(f"rep {rep}: {mode}: gms standalone{' --secure' if mode == 'secured' else ''}")
                with gms_standalone(Path(tmp) / f"{mode}-{rep}", secure=mode == "secured") as server:
                    figures.update(mode_rep(server, mode, sizes))
                log(f"rep {rep}: {mode}: " + json.dumps({k: round(v) for k, v in figures.items()
                                                         if k.startswith(mode)}))
            runs.append(figures)

    result: dict[str, Any] = {"bench": "security", "quick": args.quick, "reps": reps, **sizes, "size": SIZE,
                              "batch": PIPE}
    for key in runs[0]:
        values = [r[key] for r in runs]
        precision = 1 if key.endswith("_us") or key.endswith("_pct") else 0
        result[key] = round(median(values), precision)
        if reps > 1 and not key.endswith("_pct"):
            result[f"{key}_runs"] = [round(v, precision) for v in values]
    result["tls_produce_ratio"] = round(result["secured_produce_msgs_per_s"] / result["plain_produce_msgs_per_s"], 3)
    result["tls_consume_ratio"] = round(result["secured_consume_msgs_per_s"] / result["plain_consume_msgs_per_s"], 3)
    result["send_p50_delta_us"] = round(result["secured_send_p50_us"] - result["plain_send_p50_us"], 1)
    result.update({k: round(v, 3) for k, v in auth.items()})
    result["targets_met"] = {"tls_produce_ratio": result["tls_produce_ratio"] >= 0.7,
                             "tls_consume_ratio": result["tls_consume_ratio"] >= 0.7,
                             "auth_overhead_us": result["auth_overhead_us"] <= 5.0}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
