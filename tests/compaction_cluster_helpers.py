"""Keyed messages of the compacted-topic cluster tests and reads of a queue from its start."""

from __future__ import annotations

from typing import Any
from zlib import crc32

from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode
from gms.record import Record, iter_records
from gms.record.layout import TOMBSTONE_PROPERTY

KEYS = 13
# a broker's [store] settings: the cleaner every 200 ms
CLEANER_TOML = "\n[store]\ncompaction_check_interval_ms = 200\ncheckpoint_interval_ms = 50\n"


def keyed(topic: str, first: int, n: int) -> list[dict[str, Any]]:
    """Message ``seq`` has key k<seq % KEYS> (the SDK's ``key=``, stored as its first key), body
    ``seq``; every 7th is a tombstone."""
    return [{"topic": topic, "body": b"%d" % seq, "key": f"k{seq % KEYS}", "queue": 0,
             "properties": {TOMBSTONE_PROPERTY: "1"} if seq % 7 == 6 else None} for seq in range(first, first + n)]


def latest(end: int) -> dict[str, int]:
    return {f"k{seq % KEYS}": seq for seq in range(end)}


def _ask(address: str, code: int, fields: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    host, port = address.rsplit(":", 1)
    conn = BlockingConnection.open(host, int(port))
    try:
        frame = conn.request(code, fields, timeout_ms=5000)
    finally:
        conn.close()
    return dict(frame.fields), bytes(frame.body)


def read_records(address: str, topic: str, offset: int) -> list[Record]:
    """The records one PULL of queue 0 from ``offset`` serves."""
    body = _ask(address, RequestCode.PULL, {"topic": topic, "queue_id": 0, "offset": offset, "max_msgs": 1000,
                                            "max_bytes": 1 << 20})[1]
    return list(iter_records(body))


def read_from_start(address: str, topic: str) -> list[tuple[int, str, int]]:
    """(offset, key, body) of every record PULLs from queue 0's first offset serve."""
    found: list[tuple[int, str, int]] = []
    offset = _ask(address, RequestCode.QUERY_MIN_OFFSET, {"topic": topic, "queue_id": 0})[0]["offset"]
    while True:
        fields, body = _ask(address, RequestCode.PULL, {"topic": topic, "queue_id": 0, "offset": offset,
                                                        "max_msgs": 1000, "max_bytes": 1 << 20})
        found += [(r.queue_offset, r.keys[0], int(bytes(r.body))) for r in iter_records(body)]
        if fields["next_offset"] <= offset:
            return found
        offset = fields["next_offset"]


def compacted(found: list[tuple[int, str, int]], end: int, point: int) -> bool:
    """Below ``point`` one record per key, the latest; every record from there to ``end``."""
    below = [seq for offset, _, seq in found if offset < point]
    return (len(below) == KEYS and {key: seq for _, key, seq in found} == latest(end)
            and [o for o, _, _ in found if o >= point] == list(range(point, end)))


def compacted_chunks(address: str, topic: str, leader_epoch: int, bytes_max: int,
                     point: int = -1) -> tuple[int, list[list[Record]]]:
    """The leader's compacted log of queue 0 as REPLICA_COMPACTED sends it, ``bytes_max`` a chunk
    (asked from byte 0 for ``point``): the point and each chunk's records; every answer's CRC and
    position checked."""
    chunks: list[list[Record]] = []
    position = 0
    while True:
        fields, body = _ask(address, RequestCode.REPLICA_COMPACTED, {
            "replica": "test", "topic": topic, "queue_id": 0, "leader_epoch": leader_epoch, "point": point,
            "position": position, "bytes_max": bytes_max})
        assert fields["position"] == position and fields["crc"] == crc32(body)
        point, position = fields["point"], fields["next_position"]
        chunks.append(list(iter_records(body)))
        if position >= fields["size"]:
            return point, chunks
