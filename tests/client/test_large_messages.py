"""Message size limits are the topic's (`gms topic create --message-size-max`), end to end through
the SDK: a topic allowed 10 MiB takes a 10 MiB body, one with the 4 MiB default refuses it with
an error naming the topic and the setting to change, and a limit above the ceiling every part
can carry is refused when it is set."""

from __future__ import annotations

import uuid

import pytest
from gms_cluster import LocalCluster

from gms.client import Admin, Consumer, Producer
from gms.cluster.model import MESSAGE_SIZE_BYTES_MAX_CEILING
from gms.errors import GmsError, MessageIllegalError

MIB = 1 << 20
BODY = b"x" * (10 * MIB)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("large"))
    try:
        running.start()  # 64 MiB commitlog files: a 10 MiB record fits
        yield running
    finally:
        running.stop()


def test_a_topic_allowed_10_mib_takes_a_10_mib_body_and_the_default_refuses_it(cluster):
    big, small = f"big-{uuid.uuid4().hex[:6]}", f"small-{uuid.uuid4().hex[:6]}"
    with Admin(nameserver=cluster.nameserver) as admin:
        admin.create_topic(big, 1, settings={"message_size_bytes_max": 11 * MIB})
        admin.create_topic(small, 1)
    with Producer(nameserver=cluster.nameserver) as producer:
        stored = producer.send(big, BODY)
        assert producer.send_async(big, BODY).result(60).queue_offset == stored.queue_offset + 1
        for send in (lambda: producer.send(small, BODY), lambda: producer.send_async(small, BODY).result(60)):
            with pytest.raises(MessageIllegalError) as refused:
                send()
            assert small in str(refused.value) and "--message-size-max" in str(refused.value), refused.value
    with Consumer(nameserver=cluster.nameserver, group=f"g-{uuid.uuid4().hex[:6]}", subscription={big: "*"},
                  start_from="first") as consumer:
        got: list[bytes] = []
        for _ in range(100):
            got += [m.body for m in consumer.poll(500)]
            if len(got) == 2:
                break
    assert got == [BODY, BODY]


def test_a_limit_above_the_ceiling_is_refused_naming_the_setting(cluster):
    with Admin(nameserver=cluster.nameserver) as admin, pytest.raises(GmsError, match="message_size_bytes_max"):
        admin.create_topic(f"huge-{uuid.uuid4().hex[:6]}", 1,
                           settings={"message_size_bytes_max": MESSAGE_SIZE_BYTES_MAX_CEILING + 1})
