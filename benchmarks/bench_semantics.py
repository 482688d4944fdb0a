"""RocketMQ messaging semantics through the public path: scheduled messages, FIFO, retries, pop.

``gms standalone`` on free ports, the SDK through the nameserver:

- **Timer lateness** (``timer_fire_late_p50_ms``, ``timer_fire_late_p99_ms``; targets ≤ 20 and
  ≤ 100 ms at 10 k scheduled messages per second): a producer schedules messages at a steady
  ``--rate`` (``send_async`` with ``deliver_at``), each due ``LEAD_MS`` after it is sent; a
  consumer group reads them; lateness = when the consumer got the message − its delivery time
  (what a user sees: the broker's firing, the copy's append and the pull); ``timer_stored_late_*``
  is the broker's part (the delivered copy's store timestamp − the delivery time).
- **Pending timers in memory** (``timers_pending_1m_rss_mb``, target ≤ 200 MB): the broker's
  resident set after ``pending`` messages scheduled an hour ahead (scaled to a million), its
  growth over the idle broker (``timers_pending_rss_growth_mb``) and the part of that growth that
  is not the mapped store files holding the messages themselves (``timers_pending_anon_growth_mb``).

- **FIFO groups** (``fifo_groups_msgs_per_s``): messages of ``FIFO_GROUPS`` message groups over
  8 queues, read by a ``fifo=True`` consumer's ``listen`` (every body read), messages per second.
- **Retry lateness** (``retry_redeliver_late_p99_ms``): messages nacked with a 1 s delay come back
  through the group's retry topic; lateness = when it came again − (nack + delay).

- **Pop consumption** (``pop_msgs_per_s``, target ≥ 50 % of ordinary consumption): messages
  received by a ``SimpleConsumer`` (``receive`` of ``POP_BATCH``, every body read, then
  ``ack_async`` of the batch), against a clustering ``Consumer`` of another group reading the same messages
  (``consume_msgs_per_s``); ``pop_consume_ratio`` is the first over the second.

    python benchmarks/bench_semantics.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_peers import gms_standalone, pct

from gms.client import SendFuture

LEAD_MS = 1000  # how far ahead each timed message is scheduled
TOPIC_SETTLE_S = 0.5
QUICK = {"timed": 20_000, "rate": 10_000, "pending": 200_000, "fifo": 50_000, "retries": 2_000, "pop": 200_000}
FULL = {"timed": 100_000, "rate": 10_000, "pending": 1_000_000, "fifo": 200_000, "retries": 10_000,
        "pop": 1_000_000}
POP_BATCH = 4096  # as many as the consumer's fetches (fetch_max_messages)
FIFO_GROUPS = 100
RETRY_DELAY_MS = 1000


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A resident-set figure of ``pid`` in MiB (VmRSS; RssAnon: the heap, without mapped files)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def timer_lateness(nameserver: str, timed: int, rate: int) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer
    from gms.record.layout import DELIVER_AT_PROPERTY

    with Admin(nameserver=nameserver) as admin:
        admin.create_topic("bench-timers", queues=4)
    time.sleep(TOPIC_SETTLE_S)
    # The topic is new: from its first offsets the group reads every message sent, however late
    # its queues are assigned ("last" would skip the copies stored before that).
    consumer = Consumer(nameserver=nameserver, group="bench-timers", subscription={"bench-timers": "*"},
                        start_from="first")
    late: list[int] = []
    sent_ok = [timed]  # lowered once the sends are answered, if some failed
    consumer.poll(timeout_ms=500)  # joined before the first message comes due

    def consume() -> None:  # its own thread, polling all the time, as an application would
        deadline = time.monotonic() + timed / rate + LEAD_MS / 1000 + 30
        while len(late) < sent_ok[0] and time.monotonic() < deadline:
            late.extend(_lateness(consumer.poll(timeout_ms=100), DELIVER_AT_PROPERTY))

    reader = threading.Thread(target=consume)
    reader.start()
    sends = Sends()
    try:
        with Producer(nameserver=nameserver, linger_ms=2) as producer:
            started = time.monotonic()
            for i in range(timed):
                ahead = started + i / rate - time.monotonic()
                if ahead > 0.002:
                    time.sleep(ahead)
                sends.add(producer.send_async("bench-timers", b"t", deliver_at=int(time.time() * 1000) + LEAD_MS))
            producer.flush()
            sent_ok[0] = timed - len(sends.failures())
        reader.join()
    finally:
        consumer.close()
    sends.check("scheduled")
    if len(late) != timed:
        raise RuntimeError(f"{len(late)} of {timed} scheduled messages arrived (every send was acknowledged)")
    late.sort()
    FIRED_LATE.sort()
    return {"timer_fire_late_p50_ms": pct(late, 50), "timer_fire_late_p99_ms": pct(late, 99),
            "timer_fire_late_max_ms": late[-1], "timer_stored_late_p50_ms": pct(FIRED_LATE, 50),
            "timer_stored_late_p99_ms": pct(FIRED_LATE, 99), "timer_rate_per_s": rate, "timed_messages": timed}


class Sends:
    """The futures of a part's ``send_async`` calls: a send the broker refused is reported as
    such, not as a message that did not arrive."""

    def __init__(self) -> None:
        self._futures: list[SendFuture] = []

    def add(self, future: SendFuture) -> None:
        self._futures.append(future)

    def failures(self) -> list[BaseException]:
        """The errors of the failed sends (after the producer's flush: every future is done)."""
        return [e for e in map(SendFuture.exception, self._futures) if e is not None]

    def check(self, what: str) -> None:
        failed = self.failures()
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(self._futures)} {what} sends failed, the first with "
                               f"{type(failed[0]).__name__}: {failed[0]}")


def _lateness(messages: object, prop: str) -> list[int]:
    now = int(time.time() * 1000)
    out = []
    for m in messages:  # type: ignore[attr-defined]
        due = int(m.properties[prop])
        out.append(now - due)
        FIRED_LATE.append(m.store_timestamp_ms - due)
    return out


FIRED_LATE: list[int] = []  # the copy's store timestamp - due: the broker's part of the lateness


def pending_memory(nameserver: str, broker_pid: int, pending: int) -> dict[str, float]:
    from gms.client import Admin, Producer

    with Admin(nameserver=nameserver) as admin:
        admin.create_topic("bench-pending", queues=4)
    time.sleep(TOPIC_SETTLE_S)
    idle, idle_anon = rss_mb(broker_pid), rss_mb(broker_pid, "RssAnon")
    at = int(time.time() * 1000) + 3_600_000
    sends = Sends()
    with Producer(nameserver=nameserver, linger_ms=5) as producer:
        for i in range(pending):
            sends.add(producer.send_async("bench-pending", b"p", deliver_at=at + i % 60_000))
        producer.flush()
    sends.check("pending scheduled")
    time.sleep(1.0)
    full, full_anon = rss_mb(broker_pid), rss_mb(broker_pid, "RssAnon")
    scaled = idle + (full - idle) * 1_000_000 / pending
    return {"timers_pending": pending, "timers_pending_rss_mb": round(full, 1),
            "timers_pending_rss_growth_mb": round(full - idle, 1), "timers_pending_1m_rss_mb": round(scaled, 1),
            "timers_pending_anon_growth_mb": round(full_anon - idle_anon, 1),  # without the mapped store files
            "broker_idle_rss_mb": round(idle, 1)}


def fifo_throughput(nameserver: str, count: int) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer

    with Admin(nameserver=nameserver) as admin:
        admin.create_topic("bench-fifo", queues=8)
    time.sleep(TOPIC_SETTLE_S)
    sends = Sends()
    with Producer(nameserver=nameserver, linger_ms=5) as producer:
        for i in range(count):
            sends.add(producer.send_async("bench-fifo", b"f" * 100, message_group=f"g{i % FIFO_GROUPS}"))
        producer.flush()
    sends.check("FIFO")
    consumer = Consumer(nameserver=nameserver, group="bench-fifo", subscription={"bench-fifo": "*"},
                        start_from="first", fifo=True)
    got = [0]

    def handle(message: object) -> None:
        got[0] += len(message.body)  # type: ignore[attr-defined]

    started = time.monotonic()
    try:
        consumer.listen(handle, stop=lambda: got[0] >= count * 100 or time.monotonic() - started > 120)
    finally:
        consumer.close()
    if got[0] != count * 100:
        raise RuntimeError(f"FIFO consumer read {got[0] // 100} of {count}")
    return {"fifo_groups_msgs_per_s": round(count / (time.monotonic() - started)), "fifo_groups": FIFO_GROUPS}


def retry_lateness(nameserver: str, count: int) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer

    with Admin(nameserver=nameserver) as admin:
        admin.create_topic("bench-retry", queues=4)
    time.sleep(TOPIC_SETTLE_S)
    sends = Sends()
    with Producer(nameserver=nameserver, linger_ms=5) as producer:
        for i in range(count):
            sends.add(producer.send_async("bench-retry", str(i).encode()))
        producer.flush()
    sends.check("retried")
    consumer = Consumer(nameserver=nameserver, group="bench-retry", subscription={"bench-retry": "*"},
                        start_from="first")
    nacked: dict[bytes, float] = {}
    late: list[int] = []
    deadline = time.monotonic() + 120
    try:
        while len(late) < count and time.monotonic() < deadline:
            for message in consumer.poll(timeout_ms=100):
                body = bytes(message.body)
                if message.reconsume_times == 0:
                    consumer.nack(message, delay_ms=RETRY_DELAY_MS)
                    nacked[body] = time.monotonic()
                else:
                    late.append(round((time.monotonic() - nacked[body]) * 1000) - RETRY_DELAY_MS)
    finally:
        consumer.close()
    if len(late) != count:
        raise RuntimeError(f"{len(late)} of {count} nacked messages came back")
    late.sort()
    return {"retry_redeliver_late_p50_ms": pct(late, 50), "retry_redeliver_late_p99_ms": pct(late, 99),
            "retried_messages": count}


def pop_throughput(nameserver: str, count: int, batch: int) -> dict[str, float]:
    from gms.client import Admin, Consumer, Producer, ProducerRecord, SimpleConsumer

    with Admin(nameserver=nameserver) as admin:
        admin.create_topic("bench-pop", queues=4)
    time.sleep(TOPIC_SETTLE_S)
    with Producer(nameserver=nameserver) as producer:
        for start in range(0, count, 1000):
            producer.send_batch([ProducerRecord("bench-pop", b"p" * 100)] * min(1000, count - start))
    consumer = Consumer(nameserver=nameserver, group="bench-pull", subscription={"bench-pop": "*"},
                        start_from="first")
    read = 0
    started = time.monotonic()
    try:
        while read < count * 100 and time.monotonic() - started < 120:
            read += sum(len(m.body) for m in consumer.poll(timeout_ms=200))
    finally:
        consumer.close()
    consume_s = time.monotonic() - started
    popper = SimpleConsumer(nameserver=nameserver, group="bench-pop", subscription={"bench-pop": "*"},
                            start_from="first", await_duration_ms=200)
    popped = 0
    started = time.monotonic()
    try:
        while popped < count * 100 and time.monotonic() - started < 120:
            messages = popper.receive(batch)
            popped += sum(len(m.body) for m in messages)
            popper.ack_async(messages)  # travels while the next receive goes out
    finally:
        popper.close()  # waits for the last acknowledgements (counted)
    pop_s = time.monotonic() - started
    if read != count * 100 or popped != count * 100:
        raise RuntimeError(f"consumed {read // 100} and popped {popped // 100} of {count}")
    return {"pop_msgs_per_s": round(count / pop_s), "consume_msgs_per_s": round(count / consume_s),
            "pop_consume_ratio": round(consume_s / pop_s, 3), "pop_batch": batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer messages (well under two minutes)")
    parser.add_argument("--only", choices=["timers", "pending", "fifo", "retries", "pop"], action="append",
                        help="run only these parts (repeatable; default: all)")
    parser.add_argument("--pop-batch", type=int, default=POP_BATCH, help="messages per receive")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    figures: dict[str, object] = {"bench": "semantics", "quick": args.quick}
    parts = set(args.only or ["timers", "pending", "fifo", "retries", "pop"])
    with tempfile.TemporaryDirectory() as root, gms_standalone(Path(root)) as (nameserver, broker_pid):
        if "timers" in parts:
            log(f"timer lateness: {sizes['timed']} messages at {sizes['rate']}/s, each due {LEAD_MS} ms later")
            figures.update(timer_lateness(nameserver, sizes["timed"], sizes["rate"]))
        if "pending" in parts:
            log(f"pending timers: {sizes['pending']} scheduled an hour ahead")
            figures.update(pending_memory(nameserver, broker_pid, sizes["pending"]))
        if "fifo" in parts:
            log(f"FIFO: {sizes['fifo']} messages in {FIFO_GROUPS} message groups")
            figures.update(fifo_throughput(nameserver, sizes["fifo"]))
        if "retries" in parts:
            log(f"retries: {sizes['retries']} messages nacked with a {RETRY_DELAY_MS} ms delay")
            figures.update(retry_lateness(nameserver, sizes["retries"]))
        if "pop" in parts:
            log(f"pop: {sizes['pop']} messages, pulled by one group and popped by another ({args.pop_batch} a time)")
            figures.update(pop_throughput(nameserver, sizes["pop"], args.pop_batch))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
