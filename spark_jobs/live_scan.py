"""Reading a live cluster through the SDK: plan queue ranges from the brokers' offsets, then each
Spark task pulls its range from the broker that holds the queue (no shared disk needed).

Pull responses carry records in the stored format, so they go through the same checks and
column builders as a store read. The broker filters by tag hash; exact tags and time are
re-checked here.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from gms.client.runtime import ClientRuntime
from gms.errors import GmsError
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame
from gms.protocol.groups import QueueOffset
from gms.protocol.rows import encode
from gms.record import HEADER_SIZE, OFF_PHYS_OFFSET, OFF_QUEUE_OFFSET, scan_records
from gms.spark_jobs.arrow_batches import check_records, to_batch
from gms.spark_jobs.options import BATCH_BYTES_MAX, EARLIEST, LATEST, ReadOptions, resolve_offset
from gms.spark_jobs.partitions import BadRecordSink, QueueRange, QueueSpan, after_index_filters
from gms.spark_jobs.store_scan import msg_id_prefix, selected_topics

PULL_RECORDS_MAX = 4096  # the broker's PULL_MSGS_MAX
PULL_BYTES_MAX = 16 << 20  # the broker's PULL_BYTES_MAX
log = logging.getLogger(__name__)
_SIZE = struct.Struct(">i")
_ENVELOPE = struct.Struct(">qq")  # queue_offset, phys_offset: adjacent in the record envelope
assert OFF_QUEUE_OFFSET + _ENVELOPE.size // 2 == OFF_PHYS_OFFSET


def open_runtime(options: ReadOptions) -> ClientRuntime:
    if options.nameserver is not None:
        return ClientRuntime(None, nameserver=options.nameserver, name="gms-spark")
    return ClientRuntime(list(options.brokers or ()), name="gms-spark")


async def _request(runtime: ClientRuntime, broker: str, code: int, fields: dict[str, Any]) -> dict[str, Any]:
    return dict((await runtime.pool.request(broker, code, fields)).fields)


async def _spans(runtime: ClientRuntime, options: ReadOptions) -> list[QueueSpan]:
    brokers = await runtime.routes.live_brokers()
    available: dict[str, int] = {}
    for answer in await asyncio.gather(*(_request(runtime, b, RequestCode.TOPIC_LIST, {}) for b in brokers)):
        for topic, count in answer["topics"].items():
            available[topic] = available.get(topic, 0) + count
    spans: list[QueueSpan] = []
    for topic in selected_topics(available, options.topics):
        for route in sorted(await runtime.routes.routes(topic), key=lambda r: r.queue_id):
            fields = {"topic": topic, "queue_id": route.queue_id}
            low = (await _request(runtime, route.broker, RequestCode.QUERY_MIN_OFFSET, fields))["offset"]
            high = (await _request(runtime, route.broker, RequestCode.QUERY_MAX_OFFSET, fields))["offset"]
            start = resolve_offset(options.starting_offsets, topic, route.queue_id, low, high, EARLIEST)
            end = resolve_offset(options.ending_offsets, topic, route.queue_id, low, high, LATEST)
            for bound, name in ((options.start_time_ms, "start"), (options.end_time_ms, "end")):
                if bound is not None and start < end:
                    found = (await _request(runtime, route.broker, RequestCode.QUERY_OFFSET_BY_TIME,
                                            {**fields, "timestamp_ms": bound}))["offset"]
                    start, end = (max(start, found), end) if name == "start" else (start, min(end, found))
            spans.append(QueueSpan(topic, route.queue_id, start, max(start, end), route.broker))
    return spans


def live_spans(options: ReadOptions) -> list[QueueSpan]:
    """The selected offsets of every queue of the selected topics, asked of their brokers."""
    runtime = open_runtime(options)
    try:
        return runtime.run(_spans(runtime, options))
    finally:
        runtime.close()


async def _commit(runtime: ClientRuntime, group: str, offsets: dict[str, dict[str, int]]) -> None:
    by_leader: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for topic, queues in offsets.items():
        leaders = {route.queue_id: route.broker for route in await runtime.routes.routes(topic)}
        for queue, offset in queues.items():
            if int(queue) in leaders:  # no leader now: the next micro-batch commits it
                by_leader[leaders[int(queue)]].append(encode(QueueOffset(topic, int(queue), offset)))
    await asyncio.gather(*(_request(runtime, broker, RequestCode.COMMIT_OFFSET, {"group": group, "offsets": items})
                           for broker, items in by_leader.items()))


def commit_group(options: ReadOptions, group: str, offsets: dict[str, dict[str, int]]) -> None:
    """Commit a streaming query's next offsets (``{topic: {"queue id": offset}}``) as ``group``'s
    on each queue's leader, as a consumer of the group would. A failure that may pass (a broker
    down, a leader moving) is logged, not raised: the query's checkpoint, not the group, is where
    it resumes, and the next micro-batch commits again. Any other (access denied, a bad group
    name) is raised: the query fails with it."""
    runtime = open_runtime(options)
    try:
        runtime.run(_commit(runtime, group, offsets))
    except (GmsError, OSError) as err:  # OSError: TimeoutError, a connection refused
        if isinstance(err, GmsError) and not err.retriable:
            raise
        log.warning("committing the offsets of group %s: %r", group, err)
    finally:
        runtime.close()


def _walk(body: memoryview) -> tuple[np.ndarray, np.ndarray, int]:
    """Record starts and sizes of a pull body by their length fields; the third value is where a
    length stops making sense (== len(body) when the whole body was walked). The walk is
    ``scan_records``' (in C); a record whose magic is bad but whose length holds is stepped over
    here, so :func:`check_records` reports it and the records after it are still read."""
    parts, pos, end = [], 0, len(body)
    while True:
        scan = scan_records(body, pos, verify_crc=False)
        parts.append(scan.starts)
        pos = scan.stop_pos
        if pos + HEADER_SIZE > end:
            break
        size = _SIZE.unpack_from(body, pos)[0]
        if size < HEADER_SIZE or pos + size > end:
            break
        parts.append(np.array([pos], np.int64))
        pos += size
    starts = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return starts, np.diff(starts, append=pos), pos


def _envelope(body: memoryview, pos: int, fallback_offset: int) -> tuple[int, int]:
    """(queue offset, commitlog offset) from a bad record's envelope, which the CRC does not
    cover; the queue offset falls back to where the pull started when it cannot be read."""
    if pos + HEADER_SIZE > len(body):
        return fallback_offset, -1
    return _ENVELOPE.unpack_from(body, pos + OFF_QUEUE_OFFSET)


def _pull(runtime: ClientRuntime, rng: QueueRange, tags: str, offset: int) -> Future[Frame]:
    """Start a pull of ``rng``'s queue from ``offset`` on the runtime's loop."""
    assert rng.broker is not None, "live ranges are planned with their broker"
    fields = {"topic": rng.topic, "queue_id": rng.queue_id, "offset": offset, "max_msgs": PULL_RECORDS_MAX,
              "max_bytes": PULL_BYTES_MAX, "tags": tags, "poll_ms": 0}
    return asyncio.run_coroutine_threadsafe(runtime.pool.request(rng.broker, RequestCode.PULL, fields), runtime.loop)


def read_live_range(rng: QueueRange, options: ReadOptions, schema: pa.Schema,
                    report_bad: BadRecordSink) -> Iterator[pa.RecordBatch]:
    """The batches of ``rng`` pulled from its broker, each of up to ``batchRecords`` records and
    BATCH_BYTES_MAX (several pulls' records, as large as a store read's batches). Each next pull
    is asked for as soon as the previous answer says where it starts, so the broker reads it
    while this task walks the previous one and builds the batch. (An answer's body is a view of
    the connection's receive buffer, which later answers never overwrite.)"""
    broker = rng.broker
    assert broker is not None, "live ranges are planned with their broker"
    runtime = ClientRuntime([broker], name="gms-spark-task")
    prefix = msg_id_prefix(broker)
    offset = rng.start
    pending: Future[Frame] | None = _pull(runtime, rng, options.tags.expression, offset) if offset < rng.end else None
    parts: list[_Pulled] = []
    try:
        while pending is not None:
            frame, pending = pending.result(), None
            next_offset = int(frame.fields["next_offset"])
            body = memoryview(frame.body).cast("B")
            starts, sizes, walked = _walk(body)
            broken = []
            if walked < len(body):  # a broken length field: nothing after it can be walked
                broken.append(_envelope(body, walked, offset))
                next_offset = broken[0][0] + 1
            if offset < next_offset < rng.end:  # (next_offset <= offset: the queue ends before rng.end)
                pending = _pull(runtime, rng, options.tags.expression, next_offset)
            # The broker leaves records whose CRC fails on its disk out of the body and lists them.
            _report(rng, report_bad, broken + [(q, p) for q, p in frame.fields.get("damaged", ()) if q < rng.end])
            parts.append(_Pulled(np.frombuffer(body, np.uint8), starts, sizes))
            offset = next_offset
            if pending is None or sum(len(part.starts) for part in parts) >= options.batch_records or (
                    sum(len(part.body) for part in parts) + PULL_BYTES_MAX > BATCH_BYTES_MAX):
                batch = _batch(parts, rng, options, schema, prefix, report_bad)
                parts = []
                if batch is not None:
                    yield batch
    finally:
        if pending is not None:
            pending.cancel()
        runtime.close()


class _Pulled(NamedTuple):
    """A pull answer's body and its records' positions."""

    body: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray


def _report(rng: QueueRange, report_bad: BadRecordSink, found: list[tuple[int, int]]) -> None:
    """Report bad records of ``rng`` by (queue offset, commitlog offset)."""
    if found:
        report_bad(rng.topic, rng.queue_id, np.array([q for q, _ in found]), np.array([p for _, p in found]))


def _batch(parts: list[_Pulled], rng: QueueRange, options: ReadOptions, schema: pa.Schema, prefix: bytes | None,
           report_bad: BadRecordSink) -> pa.RecordBatch | None:
    """One batch of the records of ``parts`` that check out, lie in ``rng`` and pass the filters
    (None: no record does); the records that fail their checks are reported."""
    body, starts, sizes = parts[0]
    if len(parts) > 1:  # the bodies back to back: one copy (~30 ns a record)
        bases = np.cumsum([0] + [len(part.body) for part in parts[:-1]])
        body = np.concatenate([part.body for part in parts])
        starts = np.concatenate([part.starts + base for part, base in zip(parts, bases.tolist(), strict=True)])
        sizes = np.concatenate([part.sizes for part in parts])
    records, bad = check_records(body, starts, sizes, scattered=False)
    _report(rng, report_bad, [_envelope(body.data, pos, rng.start) for pos in starts[bad].tolist()])
    in_range = records.headers["queue_offset"] < rng.end
    if not in_range.all():
        records = records.take(in_range)
    records = after_index_filters(records, options)
    return to_batch(records, schema, prefix) if len(records.starts) else None
