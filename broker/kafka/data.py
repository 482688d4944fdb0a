"""Produce, Fetch and ListOffsets on the message service.

Produce stores each partition's batches as one gms send of their records (the partition the client
chose is the queue; an idempotent producer's stamped with its sequence, :mod:`.idempotence`), with
the request's acks as gms's; partitions of one request are stored one after another and waited
for together. Fetch is the message service's fetch of many queues in one
long poll, repeated until ``min_bytes`` are read or ``max_wait_ms`` passes; the records read are
answered as one uncompressed record batch per partition. gms hides a transaction's records until
it commits, so both isolation levels read the same records, the last stable offset is the high
watermark and no transaction is ever aborted in an answer.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable
from typing import Any

from gms.broker.kafka.convert import gms_bodies
from gms.broker.kafka.errors import Err, code_of
from gms.broker.kafka.fetched import fetched_batch
from gms.broker.kafka.idempotence import stamped_bodies
from gms.broker.kafka.records import UnsupportedBatch
from gms.broker.kafka.wire import Malformed
from gms.broker.services import Services
from gms.broker.services.messages import GetStatus, QueueRead
from gms.errors import GmsError
from gms.protocol.fetch import FETCH_BYTES_MAX, FETCH_MSGS_MAX, FETCH_TOTAL_BYTES_MAX, FetchRequest, QueueFetch
from gms.record import decode_record

EARLIEST_TIMESTAMP, LATEST_TIMESTAMP = -2, -1
FETCH_WAIT_MAX_MS = 30_000  # a fetch's max_wait_ms is capped here (and by the broker's long_poll_max_ms)


class UnansweredError(Exception):
    """A request without an answer failed: the server closes the connection."""


def _partition_error(code: int, message: str | None = None) -> dict[str, Any]:
    return {"error_code": code, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1,
            "error_message": message}


class Data:
    def __init__(self, services: Services) -> None:
        self.messages = services.messages
        self.topics = services.topics

    # -- Produce -----------------------------------------------------------------------------------

    async def produce(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any] | None:
        """The answer, or None for acks=0 (the client expects none; UnansweredError when a
        partition failed: the connection closes, so the client refreshes its metadata)."""
        acks = req["acks"]
        started = time.perf_counter()
        waits: list[tuple[dict[str, Any], Awaitable[dict[str, Any]]]] = []
        topics = []
        for topic in req["topic_data"]:
            rows = []
            for partition in topic["partition_data"]:
                row: dict[str, Any] = {"index": partition["index"]}
                rows.append(row)
                if acks not in (0, 1, -1):
                    row.update(_partition_error(Err.INVALID_REQUIRED_ACKS, f"acks {acks}"))
                    continue
                stored = self._store(topic["name"], partition["index"], partition["records"], acks, started, client)
                if isinstance(stored, dict):
                    row.update(stored)
                else:
                    waits.append((row, stored))
            topics.append({"name": topic["name"], "partition_responses": rows})
        if waits:
            for (row, _), outcome in zip(waits, await asyncio.gather(*(wait for _, wait in waits)), strict=True):
                row.update(outcome)
        if acks != 0:
            return {"responses": topics}
        failed = [row for rows in topics for row in rows["partition_responses"] if row["error_code"]]
        if failed:  # as Kafka: the producer expects no answer, so the connection closes instead
            raise UnansweredError(f"acks=0 produce failed: {failed[0]['error_message']}")
        return None

    def _store(self, topic: str, queue_id: int, data: memoryview | None, acks: int, started: float,
               client: str) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Store one partition's batches: the answer's fields, or (the send waits) an awaitable of them.
        A batch larger than one gms send may be (SEND_BODY_SIZE_MAX_BYTES as gms records) goes as
        several sends, one after another without a pause, so its records stay adjacent."""
        try:
            bodies = stamped_bodies(topic, queue_id, data, client, gms_bodies)
            results = [self.messages.send(body, acks, started)
                       for body in bodies or gms_bodies(topic, queue_id, data, client)]
        except UnsupportedBatch as err:
            return _partition_error(Err.UNSUPPORTED_FOR_MESSAGE_FORMAT, str(err))
        except Malformed as err:
            return _partition_error(Err.CORRUPT_MESSAGE, str(err))
        except GmsError as err:
            return _partition_error(code_of(err), str(err))
        if any(inspect.isawaitable(result) for result in results):
            return _stored_when(results)
        return _stored(results[0])

    # -- Fetch -------------------------------------------------------------------------------------

    async def fetch(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req["max_wait_ms"], 0), FETCH_WAIT_MAX_MS) / 1000
        wanted = [(topic["topic"], p["partition"], p["fetch_offset"], p["partition_max_bytes"])
                  for topic in req["topics"] for p in topic["partitions"]]
        per_queue = min(max([w[3] for w in wanted] or [1]), FETCH_BYTES_MAX)
        budget = min(max(req.get("max_bytes", FETCH_TOTAL_BYTES_MAX), 1), FETCH_TOTAL_BYTES_MAX)
        min_bytes = req["min_bytes"]
        offsets = {(topic, queue_id): offset for topic, queue_id, offset, _ in wanted}
        reads: dict[tuple[str, int], list[QueueRead]] = {}
        size = 0
        while True:
            remaining_ms = max(int((deadline - loop.time()) * 1000), 0)
            queues = [QueueFetch(topic, queue_id, offset) for (topic, queue_id), offset in offsets.items()]
            if not queues:
                await asyncio.sleep(remaining_ms / 1000)
                break
            got = await self.messages.fetch(FetchRequest(queues, {}, FETCH_MSGS_MAX, max(per_queue, 1),
                                                         max(budget - size, 1), remaining_ms, "", ""))
            failed = False
            for read in got:
                key = (read.queue.topic, read.queue.queue_id)
                reads.setdefault(key, []).append(read)
                size += read.size
                if read.error is not None or read.result is None or read.result.status is GetStatus.OFFSET_TOO_SMALL:
                    failed = True
                    del offsets[key]
                else:
                    offsets[key] = read.result.next_offset
            if failed or size >= min_bytes or size >= budget or loop.time() >= deadline:
                break
        responses: dict[str, list[dict[str, Any]]] = {}
        for topic, queue_id, _, _ in wanted:
            responses.setdefault(topic, []).append(self._partition(topic, queue_id, reads.get((topic, queue_id), [])))
        return {"error_code": 0, "session_id": 0,
                "responses": [{"topic": topic, "partitions": rows} for topic, rows in responses.items()]}

    def _partition(self, topic: str, queue_id: int, reads: list[QueueRead]) -> dict[str, Any]:
        row: dict[str, Any] = {"partition_index": queue_id, "aborted_transactions": [], "preferred_read_replica": -1,
                               "records": b""}
        views: list[memoryview] = []
        for read in reads:
            if read.error is not None:
                return {**row, "error_code": code_of(read.error), "high_watermark": -1, "last_stable_offset": -1,
                        "log_start_offset": -1}
            if read.result is not None and read.result.status is GetStatus.OFFSET_TOO_SMALL:
                return {**row, "error_code": Err.OFFSET_OUT_OF_RANGE, "high_watermark": -1,
                        "last_stable_offset": -1, "log_start_offset": read.result.min_offset}
            if read.result is not None:
                views += read.result.records
        try:
            high = self.messages.max_offset(topic, queue_id)
            low = self.messages.min_offset(topic, queue_id)
        except GmsError as err:
            return {**row, "error_code": code_of(err), "high_watermark": -1, "last_stable_offset": -1,
                    "log_start_offset": -1}
        if views:
            row["records"] = fetched_batch(views)
        return {**row, "error_code": 0, "high_watermark": high, "last_stable_offset": high, "log_start_offset": low}

    # -- ListOffsets -------------------------------------------------------------------------------

    def list_offsets(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        return {"topics": [{"name": topic["name"], "partitions": [
            self._offset(topic["name"], p["partition_index"], p["timestamp"]) for p in topic["partitions"]]}
            for topic in req["topics"]]}

    def _offset(self, topic: str, queue_id: int, timestamp: int) -> dict[str, Any]:
        row: dict[str, Any] = {"partition_index": queue_id, "leader_epoch": -1}
        try:
            self.topics.check_led(topic, queue_id)
            if timestamp == EARLIEST_TIMESTAMP:
                return {**row, "error_code": 0, "timestamp": -1, "offset": self.messages.min_offset(topic, queue_id)}
            if timestamp == LATEST_TIMESTAMP:
                return {**row, "error_code": 0, "timestamp": -1, "offset": self.messages.max_offset(topic, queue_id)}
            if timestamp < 0:
                return {**row, "error_code": Err.INVALID_REQUEST, "timestamp": -1, "offset": -1}
            offset = self.messages.offset_for_timestamp(topic, queue_id, timestamp)
            entry = None
            if offset < self.messages.max_offset(topic, queue_id):
                entry = self.messages.entry(topic, queue_id, offset)
        except GmsError as err:
            return {**row, "error_code": code_of(err), "timestamp": -1, "offset": -1}
        if entry is None:
            return {**row, "error_code": 0, "timestamp": -1, "offset": -1}
        return {**row, "error_code": 0, "timestamp": decode_record(entry, verify_crc=False).born_ts_ms,
                "offset": offset}


def _stored(result: Any) -> dict[str, Any]:
    return {"error_code": 0, "base_offset": int(result.queue_offsets[0]), "log_append_time_ms": -1,
            "log_start_offset": -1, "error_message": None}


async def _stored_when(results: list[Any]) -> dict[str, Any]:
    try:
        first = await results[0] if inspect.isawaitable(results[0]) else results[0]
        for result in results[1:]:
            if inspect.isawaitable(result):
                await result
    except GmsError as err:
        return _partition_error(code_of(err), str(err))
    return _stored(first)
