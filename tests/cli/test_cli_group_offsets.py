"""`gms group reset-offsets` and `gms group delete` as real subprocesses against a real cluster
(embedded etcd, a nameserver, two brokers): every reset mode as a dry run and executed, clamping,
where a consumer started afterwards begins, refusal while members are live, deleting, bad input."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import pytest
from test_cli_cluster import QUEUES, cluster, gms  # noqa: F401 - fixtures: one cluster per module

from gms.client import Admin, Consumer, Producer
from gms.errors import GroupNotEmptyError
from gms.net import Connection, run
from gms.protocol.codes import RequestCode

PER_QUEUE = 5  # messages produced into every queue by the `filled` fixture


@pytest.fixture
def topic(gms) -> str:  # noqa: F811 - this module's topic: PER_QUEUE messages in each queue
    name = f"t-{uuid.uuid4().hex[:8]}"
    gms("topic", "create", name, "--queues", str(QUEUES))
    return name


@pytest.fixture
def filled(cluster, topic) -> str:  # noqa: F811
    produce(cluster.nameserver, topic, PER_QUEUE)
    return topic


def produce(nameserver: str, topic: str, per_queue: int, prefix: str = "m") -> None:
    with Producer(nameserver=nameserver, linger_ms=0) as producer:
        for q in range(QUEUES):
            for i in range(per_queue):
                producer.send(topic, f"{prefix}{q}-{i}".encode(), queue=q)


def reset(gms, group: str, topic: str, *args: str, ok: bool = True):  # noqa: F811
    return gms("group", "reset-offsets", group, "--topic", topic, *args, ok=ok)


def plan(gms, group: str, topic: str, *args: str) -> dict[int, tuple[int | None, int | None]]:  # noqa: F811
    """queue → (committed, new) from the JSON answer of a reset."""
    answer = json.loads(reset(gms, group, topic, *args, "--json").stdout)
    return {q["queue_id"]: (q["committed"], q["new_offset"]) for q in answer["queues"]}


def broker_request(address: str, code: int, fields: dict) -> None:
    async def main() -> None:
        host, port = address.rsplit(":", 1)
        conn = await Connection.open(host, int(port))
        try:
            await conn.request(code, fields)
        finally:
            conn.close()

    run(main())


def every(value) -> dict[int, object]:
    return dict.fromkeys(range(QUEUES), value)


def tail_offsets(gms, group: str, topic: str) -> list[tuple[int, int]]:  # noqa: F811
    """(queue, offset) of what `gms tail --group` reads now (it stops once caught up)."""
    lines = gms("tail", topic, "--group", group, "--format", "json").stdout.splitlines()
    return sorted((m["queue_id"], m["queue_offset"]) for m in map(json.loads, lines))


def test_each_mode_as_dry_run_then_executed(gms, cluster, filled):  # noqa: F811
    group, topic = "resetter", filled
    # Nothing committed yet: a dry run shows the plan and changes nothing.
    assert plan(gms, group, topic, "--to-offset", "2") == every((None, 2))
    assert plan(gms, group, topic, "--to-offset", "2", "--dry-run") == every((None, 2))
    assert plan(gms, group, topic, "--to-earliest") == every((None, 0))
    table = reset(gms, group, topic, "--to-offset", "2").stdout
    assert "new offsets (dry run)" in table and "nothing changed (dry run)" in table
    assert plan(gms, group, topic, "--to-offset", "2", "--execute") == every((None, 2))

    assert plan(gms, group, topic, "--to-latest") == every((2, PER_QUEUE))
    assert plan(gms, group, topic, "--to-latest", "--execute") == every((2, PER_QUEUE))
    assert plan(gms, group, topic, "--shift-by", "-3", "--execute") == every((PER_QUEUE, PER_QUEUE - 3))
    assert plan(gms, group, topic, "--to-earliest", "--execute") == every((2, 0))
    assert tail_offsets(gms, group, topic) == [(q, o) for q in range(QUEUES) for o in range(PER_QUEUE)]

    # --to-datetime: the first message stored at or after the time; no zone means UTC.
    time.sleep(0.05)
    middle = datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds")
    time.sleep(0.05)
    produce(cluster.nameserver, topic, 3, prefix="late")
    assert plan(gms, group, topic, "--to-datetime", middle) == every((PER_QUEUE, PER_QUEUE))
    reset(gms, group, topic, "--to-earliest", "--execute")
    assert plan(gms, group, topic, "--to-datetime", middle, "--execute") == every((0, PER_QUEUE))
    # A consumer of the group started after the reset begins at the new offsets.
    assert tail_offsets(gms, group, topic) == [(q, o) for q in range(QUEUES) for o in range(PER_QUEUE, PER_QUEUE + 3)]


def test_results_clamp_to_the_queue_and_shift_skips_uncommitted_queues(gms, filled):  # noqa: F811
    group, topic = "clamped", filled
    assert plan(gms, group, topic, "--to-offset", "99") == every((None, PER_QUEUE))
    assert plan(gms, group, topic, "--to-datetime", "2000-01-01") == every((None, 0))
    assert plan(gms, group, topic, "--to-datetime", "2999-01-01T00:00:00Z") == every((None, PER_QUEUE))
    # Several --queue, comma lists too; the other queues keep no committed offset.
    assert plan(gms, group, topic, "--queue", "0", "--queue", "2,3", "--to-offset", "1", "--execute") == {
        0: (None, 1), 2: (None, 1), 3: (None, 1)}
    assert plan(gms, group, topic, "--shift-by", "-7", "--execute") == {0: (1, 0), 1: (None, None), 2: (1, 0),
                                                                       3: (1, 0)}
    assert plan(gms, group, topic, "--shift-by", "100") == {0: (0, PER_QUEUE), 1: (None, None), 2: (0, PER_QUEUE),
                                                            3: (0, PER_QUEUE)}
    assert "left alone" in reset(gms, group, topic, "--shift-by", "1").stdout


def test_live_members_refuse_execute_and_delete_unless_forced(gms, cluster, filled):  # noqa: F811
    group, topic = "busy", filled
    with Consumer(nameserver=cluster.nameserver, group=group, subscription={topic: "*"},
                  start_from="first", auto_commit=False) as consumer:
        deadline = time.monotonic() + 20
        while not consumer.poll(200) and time.monotonic() < deadline:
            pass
        refused = reset(gms, group, topic, "--to-earliest", "--execute", ok=False)
        assert refused.returncode == 1
        assert "live member" in refused.stderr and "--force" in refused.stderr
        described = json.loads(gms("group", "describe", group, "--json").stdout)
        assert all(m["member"] in refused.stderr for m in described["members"])
        # The queue's leader refuses on its own too (its queue is being read), wherever the
        # group's coordinator is.
        with Admin(nameserver=cluster.nameserver) as admin:
            leader = next(s["broker"] for s in admin.topic_stats(topic) if s["queue_id"] == 0)
        with pytest.raises(GroupNotEmptyError, match="live members"):
            broker_request(leader, RequestCode.RESET_OFFSETS, {"group": group, "offsets": [[topic, 0, 0]]})
        dry = reset(gms, group, topic, "--to-earliest")  # a dry run is never refused, but it warns
        assert "warning" in dry.stderr and "--force" in dry.stderr
        assert plan(gms, group, topic, "--to-offset", "3", "--execute", "--force") == every((None, 3))

        refused = gms("group", "delete", group, "--yes", ok=False)
        assert refused.returncode == 1 and "live member" in refused.stderr and "--force" in refused.stderr
        gms("group", "delete", group, "--yes", "--force")
        assert plan(gms, group, topic, "--to-earliest") == every((None, 0))


def test_delete_removes_the_offsets_and_the_group(gms, filled):  # noqa: F811
    group, topic = "doomed", filled
    assert len(gms("tail", topic, "--group", group, "--count", "6").stdout.splitlines()) == 6
    reset(gms, group, topic, "--to-offset", "4", "--execute")
    assert group in json.loads(gms("group", "list", "--json").stdout)
    deleted = json.loads(gms("group", "delete", group, "--yes", "--json").stdout)
    assert sum(t == topic for queues in deleted["queues"].values() for t, _ in queues) == QUEUES
    assert group not in json.loads(gms("group", "list", "--json").stdout)
    gone = gms("group", "describe", group, ok=False)
    assert gone.returncode == 1 and f"no broker knows consumer group {group}" in gone.stderr
    assert plan(gms, group, topic, "--to-earliest") == every((None, 0))
    again = gms("group", "delete", group, "--yes", ok=False)
    assert again.returncode == 1 and f"knows group {group!r}" in again.stderr


@pytest.mark.parametrize("args, message", [
    (["--topic", "no-such-topic", "--to-earliest"], "Invalid value for '--topic'"),
    (["--topic", "{topic}", "--queue", str(QUEUES), "--to-earliest"], "Invalid value for '--queue'"),
    (["--topic", "{topic}", "--queue", "x", "--to-earliest"], "'x' is not a queue id"),
    (["--topic", "{topic}", "--to-earliest", "--to-latest"], "(got --to-earliest and --to-latest)"),
    (["--topic", "{topic}"], "give exactly one of --to-earliest"),
    (["--topic", "{topic}", "--to-latest", "--dry-run", "--execute"], "exclude each other"),
    (["--topic", "{topic}", "--to-datetime", "yesterday"], "Invalid value for '--to-datetime'"),
    (["--topic", "{topic}", "--to-offset", "-1"], "x>=0"),
    (["--to-earliest"], "Missing option '--topic'"),
])
def test_bad_input_is_a_usage_error(gms, topic, args, message):  # noqa: F811
    result = gms("group", "reset-offsets", "g", *(a.format(topic=topic) for a in args), ok=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
