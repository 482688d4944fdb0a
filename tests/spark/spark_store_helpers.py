"""Stores for the Spark tests, written with the real storage engine (small files force rolls)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import Message, encode_batch

ORDERS = 1200
MANY_QUEUES = 40
TAGS = ("created", "paid", None)
APPEND_GAP_S = 0.003
# Small files force rolls; a broker opening these stores must use the same sizes (broker_toml).
STORE_SETTINGS = {"commitlog_file_size_bytes": 1 << 16, "cq_entries_per_file": 64, "flush_interval_ms": 50}


def store_config() -> StoreConfig:
    return StoreConfig(**STORE_SETTINGS)


def broker_toml(directory: Path) -> Path:
    """A gms-broker --config file whose [store] table matches STORE_SETTINGS."""
    path = directory / "broker.toml"
    path.write_text("[store]\n" + "".join(f"{k} = {v}\n" for k, v in STORE_SETTINGS.items()))
    return path


def broker_on_copy(store_dir: Path, tmp_path: Path, broker_factory):
    """A broker process serving a copy of a store written with STORE_SETTINGS."""
    broker_dir = tmp_path / "broker"
    shutil.copytree(store_dir, broker_dir)
    return broker_factory("--config", str(broker_toml(tmp_path)),
                          "--commitlog-file-size", str(STORE_SETTINGS["commitlog_file_size_bytes"]),
                          "--cq-file-entries", str(STORE_SETTINGS["cq_entries_per_file"]), store_dir=broker_dir)


def order(i: int) -> Message:
    return Message("orders", b"order-%d" % i, tag=TAGS[i % 3], keys=(f"k{i % 7}", f"id{i}") if i % 2 else (),
                   properties={"n": str(i), "kind": "test"} if i % 5 else None, queue_id=i % 4,
                   born_host="10.1.2.3:5555", born_ts_ms=1_700_000_000_000 + i, reconsume_times=i % 3)


def write_store(root: Path) -> list[Message]:
    """orders: 1200 messages in 4 queues, 12 appends; many: 1 message in each of 40 queues."""
    store = MessageStore.open(root, store_config())
    store.create_topic("orders", 4)
    store.create_topic("empty", 2)
    store.create_topic("many", MANY_QUEUES)
    sent = [order(i) for i in range(ORDERS)]
    for i in range(0, ORDERS, 100):
        store.append(encode_batch(sent[i:i + 100]))
        time.sleep(APPEND_GAP_S)  # distinct store timestamps per append, for the time filters
    store.append(encode_batch([Message("many", b"m%d" % q, queue_id=q) for q in range(MANY_QUEUES)]))
    store.close()
    return sent
