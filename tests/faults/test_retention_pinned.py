"""Retention is never blocked by one reader, against a real broker process: a client that sends
pulls and never reads its socket keeps views into the oldest commitlog file in the broker's
write buffers; retention deletes that file all the same (and the files after it), the broker
keeps its map until the client goes, and other clients are served throughout."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from processes import BrokerProcess, wait_until

from gms.client import Admin, Producer
from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode as C
from gms.protocol.frame import encode_frame
from gms.record import iter_records

COMMITLOG_FILE_SIZE_BYTES = 64 * 1024
RETENTION_MS = 1500
FIRST_FILE = "0" * 20
BODY = b"m" * 200  # ~300-byte records: ~200 per commitlog file
TIMEOUT_S = 30


def start_broker(broker_factory, tmp_path: Path) -> BrokerProcess:
    config = tmp_path / "retention.toml"
    config.write_text("[store]\nretention_check_interval_ms = 100\ncheckpoint_interval_ms = 50\n")
    return broker_factory("--config", str(config), "--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES),
                          "--cq-file-entries", "500")


def stuck_reader(port: int, requests: int) -> socket.socket:
    """A connection that asks for the queue from offset 0 ``requests`` times and never reads: the
    answers (views into the first commitlog files) wait in the broker's write buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    fields = {"topic": "r", "queue_id": 0, "offset": 0, "max_msgs": 4096, "max_bytes": 16 << 20}
    sock.sendall(b"".join(bytes(part) for i in range(requests)
                          for part in encode_frame(C.PULL, i + 1, fields=fields)))
    return sock


def mapped_deleted(broker: BrokerProcess, name: str) -> bool:
    """Whether the broker still maps commitlog file ``name`` after its deletion."""
    maps = Path(f"/proc/{broker.proc.pid}/maps").read_text()
    return f"/commitlog/{name} (deleted)" in maps


def pull(address: str, offset: int) -> tuple[str, int, list[int]]:
    host, port = address.rsplit(":", 1)
    conn = BlockingConnection.open(host, int(port))
    try:
        frame = conn.request(C.PULL, {"topic": "r", "queue_id": 0, "offset": offset, "max_msgs": 64,
                                      "max_bytes": 1 << 20}, timeout_ms=5000)
    finally:
        conn.close()
    offsets = [r.queue_offset for r in iter_records(bytes(frame.body))]
    return frame.fields["result"], frame.fields["next_offset"], offsets


def test_a_reader_that_stops_reading_never_blocks_retention(broker_factory, tmp_path):
    broker = start_broker(broker_factory, tmp_path)
    commitlog_dir = broker.store_dir / "store" / "commitlog"
    with Admin([broker.address]) as admin:
        admin.create_topic("r", 1, settings={"retention_ms": RETENTION_MS})
    with Producer([broker.address]) as producer:
        producer.send_batch([{"topic": "r", "body": BODY, "queue": 0}] * 800)  # four files
        reader = stuck_reader(broker.port, 64)  # ~15 MiB of answers: far more than socket buffers hold
        try:
            def retention_went_past_the_pinned_file() -> bool:
                producer.send_batch([{"topic": "r", "body": BODY, "queue": 0}] * 20)  # writers go on
                time.sleep(0.05)
                names = sorted(p.name for p in commitlog_dir.iterdir())
                return names[0] > f"{3 * COMMITLOG_FILE_SIZE_BYTES:020d}"

            wait_until(retention_went_past_the_pinned_file, TIMEOUT_S)
            assert not (commitlog_dir / FIRST_FILE).exists()
            assert mapped_deleted(broker, FIRST_FILE)  # the stuck reader's answers still hold it
            sent = producer.send_batch([{"topic": "r", "body": b"after", "queue": 0}])
            result, _, offsets = pull(broker.address, sent[0].queue_offset)
            assert (result, offsets) == ("found", [sent[0].queue_offset])
            status, first, _ = pull(broker.address, 0)
            assert status == "offset_too_small" and first > 800
        finally:
            reader.close()
        # Released: the next retention pass closes the map.
        wait_until(lambda: not mapped_deleted(broker, FIRST_FILE), TIMEOUT_S)
