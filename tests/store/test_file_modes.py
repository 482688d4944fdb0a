"""A broker's store is its user's only: every file 0600, every directory 0700, whatever the
umask; a store left looser by an older version is tightened when it is opened."""

from __future__ import annotations

import logging
import os

import pytest
from file_modes import modes, not_private, umask
from processes import BrokerProcess
from store_helpers import batch, small_config

from gms.broker.atomic_file import write_atomically
from gms.broker.consumequeue.min_offsets import save_min_offsets
from gms.broker.ha.state_file import ReplicationStateFile
from gms.broker.offsets import OffsetStore
from gms.broker.store import MessageStore
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C


def fill(data_dir):
    """A store under ``data_dir`` with every kind of file a broker writes: rolled commitlog
    files, consumeQueues of two topics, topics, layout, checkpoint, queue minimums, a
    truncation marker, committed offsets and replication state."""
    store = MessageStore.open(data_dir / "store", small_config())
    try:
        store.create_topic("t", 2)
        store.create_topic("u", 1)
        for i in range(20):  # 4 KiB commitlog files: several of them
            store.append(batch("t", 10, queue_id=i % 2, start=10 * i))
            store.append(batch("u", 3, queue_id=0))
        store.truncate_queue("u", 0, 50)
        save_min_offsets(store.paths.min_offsets, {("t", 0): 3})
        offsets = OffsetStore(store.paths.consumer_offsets)
        offsets.commit("g", "t", 0, 7)
        offsets.persist()
        state = ReplicationStateFile(store.paths.replication_state)
        state.save({("t", 0): [[1, 0]]}, {("t", 0): 5}).result()
        state.close()
        assert not (store.paths.root / "abort").stat().st_mode & 0o077
    finally:
        store.close()
    assert len(os.listdir(data_dir / "store" / "commitlog")) > 2


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o002], ids=["umask-022", "umask-000", "umask-002"])
def test_new_store_is_private_whatever_the_umask(tmp_path, mask):
    data_dir = tmp_path / "data"  # made by the store, parents included
    with umask(mask):
        fill(data_dir)
    found = modes(data_dir)
    assert {"store/commitlog/", "store/consumequeue/t/1/", "store/config/topics.json",
            "store/config/consumer_offsets.json", "store/config/replication.json",
            "store/config/truncations.json", "store/config/min_offsets.json", "store/config/layout.json",
            "store/checkpoint"} <= set(found)
    assert not_private(data_dir) == {}


def test_old_store_is_tightened_when_opened(tmp_path, caplog):
    data_dir = tmp_path / "data"
    fill(data_dir)
    for directory, _, files in os.walk(data_dir):  # as an older version left it (umask 022)
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    leftover = data_dir / "store" / "config" / "topics.json.tmp"  # a crash between write and rename
    leftover.write_bytes(b"{}")
    leftover.chmod(0o666)
    elsewhere = tmp_path / "outside"
    elsewhere.write_bytes(b"")
    (data_dir / "store" / "link").symlink_to(elsewhere)  # links are not followed
    os.chmod(elsewhere, 0o644)
    with caplog.at_level(logging.WARNING, logger="gms.private_files"):
        MessageStore.open(data_dir / "store", small_config()).close()
    warnings = [r for r in caplog.records if r.name == "gms.private_files"]
    assert len(warnings) == 1 and "readable by other users" in warnings[0].getMessage()
    store_root = data_dir / "store"
    assert not_private(store_root) == {}
    assert data_dir.stat().st_mode & 0o777 == 0o755  # the --store-dir itself is the operator's
    assert elsewhere.stat().st_mode & 0o777 == 0o644
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gms.private_files"):  # nothing left to tighten
        MessageStore.open(store_root, small_config()).close()
    assert not [r for r in caplog.records if r.name == "gms.private_files"]


def test_a_store_is_walked_until_its_directory_is_private_which_is_tightened_last(tmp_path, monkeypatch):
    """A restart does not stat every file of a private store again (~0.7 s at 10,000 queues): the
    store's directory is made private only after everything under it, so a walk cut short (a
    crash) leaves it loose and the next open walks again."""
    from gms import private_files

    data_dir = tmp_path / "data"
    fill(data_dir)
    store_root = data_dir / "store"
    os.chmod(store_root, 0o755)
    inner = store_root / "config" / "topics.json"
    inner.chmod(0o644)
    tightened = []
    real_tighten = private_files._tighten

    def recorded(path, private_mode, mode):
        tightened.append(path)
        return real_tighten(path, private_mode, mode)
    monkeypatch.setattr(private_files, "_tighten", recorded)
    MessageStore.open(store_root, small_config()).close()
    assert tightened[-1] == store_root and inner in tightened
    assert not_private(store_root) == {}
    inner.chmod(0o644)  # loosened by hand behind a private directory: left to its owner
    MessageStore.open(store_root, small_config()).close()
    assert inner.stat().st_mode & 0o777 == 0o644


def test_replaced_file_is_private_even_over_a_loose_leftover(tmp_path):
    target = tmp_path / "f.json"
    leftover = tmp_path / "f.json.tmp"
    leftover.write_bytes(b"old")
    leftover.chmod(0o644)
    with umask(0):
        write_atomically(target, b"new")
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o600


def request(port, code, fields, body=b""):
    async def main():
        conn = await Connection.open("127.0.0.1", port)
        try:
            return await conn.request(code, fields, body)
        finally:
            conn.close()

    return run(main())


def test_broker_process_keeps_its_store_private(tmp_path):
    store_dir = tmp_path / "broker"
    with umask(0):  # the broker inherits it
        broker = BrokerProcess(store_dir, []).start()
    try:
        request(broker.port, C.CREATE_TOPIC, {"topic": "orders", "queues": 2})
        for queue_id in range(2):
            request(broker.port, C.SEND_BATCH, {}, batch("orders", 50, queue_id=queue_id))
        request(broker.port, C.COMMIT_OFFSET, {"group": "g", "offsets": [["orders", 1, 42]]})
    finally:
        assert broker.stop() == 0  # a clean stop: offsets persisted, checkpoint written
    found = modes(store_dir)
    assert {"store/consumequeue/orders/1/", "store/config/consumer_offsets.json", "store/checkpoint"} <= set(found)
    assert not_private(store_dir) == {}
    with umask(0):
        broker.restart()
    try:
        assert request(broker.port, C.FETCH_OFFSET, {"group": "g", "queues": [["orders", 1]]}).fields["offsets"] == [42]
    finally:
        broker.stop()
    assert not_private(store_dir) == {}
