"""A follower's copy of its leader's compacted log of a queue (REPLICA_COMPACTED).

A follower whose fetch offset is below the leader's first offset of a queue (it fell behind the
leader's compaction point, or it is new: an empty data directory, a queue moved to it) would miss
the records the leader's compaction kept below that point. Before starting the queue over there,
it asks the leader for its compacted log of the queue, a bounded chunk of whole records per
request, and writes them to ``<point>.copy.tmp`` beside its own compacted log. Each chunk is
checked on receipt (the chunk's CRC-32, then every record's length, magic and CRC, and its queue
offset below the point). Once the copy is whole it is synced and installed as the queue's
compacted log at the leader's point (renamed, directory synced: ``MessageStore.install_copy``),
and the queue starts over there; the follower then fetches from the point.

A copy survives a failed request: the next attempt asks from where it stopped (the same point),
and starts over when the leader's log was replaced meanwhile (its point moved). A crash leaves
only the ``.tmp``, which opening the store removes; the follower's fetch offset is still below
the leader's first offset, so it copies again. A leader keeping no compacted log of the queue
(a topic with retention only) answers so, and the follower starts the queue over at the leader's
first offset, as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from isal.isal_zlib import crc32

from gms.broker.ha.partition import Partition
from gms.net import Connection
from gms.private_files import open_private
from gms.protocol.codes import RequestCode
from gms.record import RecordCheck, scan_records
from gms.record.columns import read_field_offsets
from gms.store_errors import CorruptRecord, StoreIOError

if TYPE_CHECKING:
    from gms.broker.store import MessageStore

log = logging.getLogger(__name__)

COPY_CHUNK_BYTES = 4 << 20  # asked per request (at most; the fetcher's byte bound if smaller)
COPY_CHUNKS_PER_FETCH = 8  # requests one fetch round makes before the other queues' fetch goes on
NO_POINT = -1


@dataclass(slots=True)
class _Copy:
    """A copy under way: the leader's point, the temporary file and the leader's next byte."""

    point: int
    tmp: Path
    fh: BinaryIO
    position: int = 0
    last_offset: int = -1  # the queue offset of the last record copied


class CompactedCopier:
    """The copies of one fetcher (one leader) under way, by queue."""

    def __init__(self, store: MessageStore, broker_id: str) -> None:
        self.store = store
        self.broker_id = broker_id
        self._copies: dict[tuple[str, int], _Copy] = {}

    @property
    def pending(self) -> bool:
        return bool(self._copies)

    async def copy(self, conn: Connection, p: Partition, epoch: int, bounds: tuple[int, int],
                   bytes_max: int) -> int | None:
        """Go on copying the leader's compacted log of ``p``'s queue (``bytes_max`` a request).
        ``bounds``: where the queue is to start (at least: the leader's first offset) and the
        lowest point of use. The point at which it was installed (the queue now starts at it, or
        at the start if that is beyond), NO_POINT if the leader keeps none (or one below the
        lowest point of use), None if the copy is not whole yet (the next fetch round goes on).
        StoreIOError (the copy dropped) if this broker's disk refuses it."""
        try:
            return await self._copy(conn, p.key, epoch, bounds, bytes_max)
        except OSError as err:
            self.discard(p.key)
            raise StoreIOError(f"{p.key[0]}/{p.key[1]}: cannot write the copy of the leader's compacted log:"
                               f" {err}") from err

    async def _copy(self, conn: Connection, key: tuple[str, int], epoch: int, bounds: tuple[int, int],
                    bytes_max: int) -> int | None:
        start, need = bounds
        for _ in range(COPY_CHUNKS_PER_FETCH):
            copy = self._copies.get(key)
            frame = await conn.request(RequestCode.REPLICA_COMPACTED, {
                "replica": self.broker_id, "topic": key[0], "queue_id": key[1], "leader_epoch": epoch,
                "point": NO_POINT if copy is None else copy.point, "position": 0 if copy is None else copy.position,
                "bytes_max": min(bytes_max, COPY_CHUNK_BYTES)})
            fields = frame.fields
            point, position = int(fields["point"]), int(fields["position"])
            if point == NO_POINT or point < need:
                self.discard(key)
                return NO_POINT
            if copy is None or copy.point != point or copy.position != position:
                if position:
                    raise CorruptRecord(0, f"{key[0]}/{key[1]}: the leader answered its compacted log from byte"
                                           f" {position}, not from the start")
                if copy is not None:
                    log.info("%s/%d: the leader's compacted log moved to point %d: copying it from the start",
                             *key, point)
                self.discard(key)
                copy = self._copies[key] = self._open(key, point)
            copy.last_offset = _check_chunk(key, (copy.last_offset, point), memoryview(frame.body),
                                            int(fields["crc"]))
            copy.fh.write(frame.body)
            copy.position = int(fields["next_position"])
            if copy.position >= int(fields["size"]):
                del self._copies[key]
                installed = await asyncio.to_thread(self._install, key, copy, max(point, start))
                return point if installed else None
        return None

    def _open(self, key: tuple[str, int], point: int) -> _Copy:
        tmp = self.store.copy_tmp(*key, point)
        log.info("%s/%d: copying the leader's compacted log below point %d", *key, point)
        return _Copy(point, tmp, os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb"))

    def _install(self, key: tuple[str, int], copy: _Copy, start: int) -> bool:
        try:
            with copy.fh:
                copy.fh.flush()
                os.fsync(copy.fh.fileno())
            installed = self.store.install_copy(*key, copy.point, copy.tmp, start)
        except BaseException:
            copy.tmp.unlink(missing_ok=True)  # gone already if it was renamed
            raise
        if installed:
            log.info("%s/%d: installed the leader's compacted log below point %d (%d bytes)", *key, copy.point,
                     copy.position)
        return installed

    def discard(self, key: tuple[str, int]) -> None:
        """Drop a copy under way (its file removed)."""
        copy = self._copies.pop(key, None)
        if copy is not None:
            copy.fh.close()
            copy.tmp.unlink(missing_ok=True)

    def close(self) -> None:
        for key in list(self._copies):
            self.discard(key)


def _check_chunk(key: tuple[str, int], bounds: tuple[int, int], body: memoryview, crc: int) -> int:
    """The queue offset of the last record of ``body``; CorruptRecord unless it is whole records
    (length, magic, CRC) of increasing offsets within ``bounds`` (exclusive) whose bytes have the
    CRC-32 ``crc``: nothing else is ever written to the copy."""
    if crc32(body) != crc:
        raise CorruptRecord(0, f"{key[0]}/{key[1]}: a chunk of the leader's compacted log does not match its CRC")
    after, point = bounds
    if not len(body):
        return after
    scan = scan_records(body)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
        raise CorruptRecord(0, f"{key[0]}/{key[1]}: a chunk of the leader's compacted log holds a damaged record"
                               f" at byte {scan.stop_pos}")
    offsets = read_field_offsets(body, scan.starts).headers["queue_offset"].astype(np.int64)
    if offsets[0] <= after or offsets[-1] >= point or np.any(np.diff(offsets) <= 0):
        raise CorruptRecord(0, f"{key[0]}/{key[1]}: a chunk of the leader's compacted log holds offsets out of"
                               f" order or not below its point {point}")
    return int(offsets[-1])
