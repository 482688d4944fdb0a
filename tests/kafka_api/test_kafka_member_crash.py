"""A Kafka consumer group whose member crashes: three confluent-kafka consumers, each its own
process, share a topic; one is SIGKILLed (no LeaveGroup, no last commit), the coordinator expires
it after its session timeout, the survivors rebalance and take its partitions from the group's
committed offsets, and no message is lost (the crashed member's uncommitted reads come again)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.processes import wait_until

PARTITIONS = 6
PER_PHASE = 300
WAIT_S = 90
MEMBER = r"""
import sys
from confluent_kafka import Consumer
bootstrap, group, topic, out = sys.argv[1:]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "auto.commit.interval.ms": 200})
seen = open(out, "a")


def note(line):
    seen.write(line + "\n")
    seen.flush()


consumer.subscribe([topic], on_assign=lambda _, partitions: note(
    "assigned " + ",".join(str(p.partition) for p in partitions)))
while True:
    message = consumer.poll(0.2)
    if message is not None and message.error() is None:
        note(f"{message.partition()} {message.value().decode()}")
"""


def _lines(path: Path) -> list[tuple[str, str]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(first, rest) for first, rest in (line.split(" ", 1) for line in lines if line.count(" ") == 1)]


def _seen(path: Path) -> list[tuple[int, str]]:
    """The (partition, value) of each message the member read."""
    return [(int(first), rest) for first, rest in _lines(path) if first != "assigned"]


def _assigned(path: Path) -> set[int]:
    """The member's partitions, as its last assignment gave them."""
    assignments = [rest for first, rest in _lines(path) if first == "assigned"]
    return {int(p) for p in assignments[-1].split(",") if p} if assignments else set()


def test_a_crashed_members_partitions_go_to_the_others_and_nothing_is_lost(bootstrap, tmp_path):
    topic, group = f"crash-{uuid.uuid4().hex[:8]}", f"cg-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    outputs = [tmp_path / f"member{i}.txt" for i in range(3)]
    members = [subprocess.Popen([sys.executable, "-c", MEMBER, bootstrap, group, topic, str(out)]) for out in outputs]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})

    def produce(phase: int) -> set[str]:
        values = {f"p{phase}-{i}" for i in range(PER_PHASE)}
        for i, value in enumerate(sorted(values)):
            producer.produce(topic, value=value.encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0
        return values

    def read_by(paths: list[Path]) -> set[str]:
        return {value for path in paths for _, value in _seen(path)}

    try:
        wait_until(lambda: all(_assigned(out) for out in outputs)
                   and set().union(*map(_assigned, outputs)) == set(range(PARTITIONS)), WAIT_S)
        crashed = _assigned(outputs[0])
        first = produce(1)
        wait_until(lambda: first <= read_by(outputs), WAIT_S)
        members[0].kill()  # SIGKILL: no LeaveGroup, no last commit
        members[0].wait()
        second = produce(2)
        survivors = outputs[1:]
        wait_until(lambda: first | second <= read_by(outputs) and second <= read_by(survivors), WAIT_S)
        taken_over = {partition for partition, value in _seen(outputs[1]) + _seen(outputs[2])
                      if value in second}
        assert crashed <= taken_over, f"the crashed member's partitions {crashed}, taken over {taken_over}"
    finally:
        for member in members:
            member.kill()
            member.wait()
