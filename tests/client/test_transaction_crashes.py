"""Transactions across broker crashes: half messages survive SIGKILL and a restart and commit
then; a commit the broker stored but did not acknowledge is answered OK when retried and shows
each message once; a broker restarted in the middle of a commit across queues finishes it."""

from __future__ import annotations

import threading
import time

import pytest
from processes import TEST_COMMITLOG_FILE_SIZE_BYTES, TEST_CQ_FILE_ENTRIES
from test_transactions import read, request

from gms.broker.store import MessageStore
from gms.broker.store.paths import StorePaths
from gms.broker.store_config import StoreConfig
from gms.client import Admin, Producer
from gms.protocol.codes import RequestCode
from gms.record import decode_record, encode_record
from gms.record.layout import FLAG_TIMER_COPY, ORIGIN_PROPERTY, TIMER_FLAGS

pytestmark = pytest.mark.timeout(120)


def producer_for(broker) -> Producer:
    return Producer([broker.address], group="crash", retries=12, retry_backoff_ms=100, request_timeout_ms=3000)


def test_halves_survive_a_broker_sigkill_and_commit_after_the_restart(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("crash-halves", queues=2)
    with producer_for(broker) as producer:
        tx = producer.begin_transaction()
        for i in range(6):
            producer.send("crash-halves", b"half-%d" % i, queue=i % 2, transaction=tx)
        broker.kill()
        restart = threading.Timer(0.5, broker.restart)
        restart.start()
        try:
            tx.commit()  # retried until the broker is back
        finally:
            restart.join()
    got = read(broker.address, "crash-halves", "reader", 5.0, want=6)
    time.sleep(0.3)
    got += read(broker.address, "crash-halves", "reader", 0.5)  # the same group: nothing more
    assert sorted(bytes(m.body) for m in got) == [b"half-%d" % i for i in range(6)]


def test_a_commit_stored_but_not_acknowledged_is_ok_when_retried_and_visible_once(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("crash-commit", queues=2)
    with producer_for(broker) as producer:
        tx = producer.begin_transaction()
        for i in range(4):
            producer.send("crash-commit", b"m-%d" % i, queue=i % 2, transaction=tx)
        # The commit's copies are appended (the answer says so), then the broker dies before the
        # producer hears of it: its retry reaches the restarted broker.
        answer = request(broker.address, RequestCode.END_TRANSACTION, {"tx_id": tx.tx_id, "commit": True})
        assert answer.fields["messages"] == 4 and answer.fields["state"] == "committed"
        broker.kill()
        broker.restart()
        tx.commit()
        with pytest.raises(ValueError):
            tx.rollback()
    got = read(broker.address, "crash-commit", "reader", 3.0, want=4)
    time.sleep(0.3)
    got += read(broker.address, "crash-commit", "reader", 0.5)
    assert sorted(bytes(m.body) for m in got) == [b"m-%d" % i for i in range(4)]
    with Admin([broker.address]) as admin:
        assert admin.list_transactions() == []


def test_a_commit_cut_short_across_queues_is_finished_by_the_restarted_broker(broker):
    with Admin([broker.address]) as admin:
        admin.create_topic("crash-split", queues=2)
    with Producer([broker.address], group="crash") as producer:
        tx = producer.begin_transaction()
        sent = [producer.send("crash-split", b"q%d" % q, queue=q, transaction=tx) for q in (0, 1)]
    broker.stop()
    # What a crash in the middle of the commit leaves: the copy on queue 0, none on queue 1.
    config = StoreConfig(commitlog_file_size_bytes=TEST_COMMITLOG_FILE_SIZE_BYTES,
                         cq_entries_per_file=TEST_CQ_FILE_ENTRIES)
    with MessageStore.open(StorePaths.of_broker(broker.store_dir).root, config) as store:
        half = decode_record(bytes(store.read_entry("crash-split", 0, sent[0].queue_offset)))
        copy = encode_record(topic=half.topic, body=bytes(half.body), queue_id=0, flags=FLAG_TIMER_COPY,
                             properties={**half.properties, ORIGIN_PROPERTY: str(sent[0].queue_offset)})
        store.append(copy, allowed_flags=TIMER_FLAGS)
    broker.restart()
    got = read(broker.address, "crash-split", "reader", 5.0, want=2)
    time.sleep(0.5)
    got += read(broker.address, "crash-split", "reader", 0.5)
    assert sorted(bytes(m.body) for m in got) == [b"q0", b"q1"]
    assert "committing its halves" in broker.log_tail(20_000)
