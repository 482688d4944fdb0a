"""The one validator of every append path: a leader's batch or single record, a replica's fetched
records. Nothing is written before it has passed a batch, and a batch fails whole."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, cast

import numpy as np
from isal.isal_zlib import crc32 as chunk_crc32  # zlib's CRC-32 values, several times faster

from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.store.producer_state import DuplicateBatch, ProducerStates
from gms.broker.store.queues import QueueGroup, QueueKey
from gms.broker.store.topic_table import TopicTable
from gms.broker.store.types import ReplicaGap
from gms.broker.store_config import StoreConfig
from gms.errors import DuplicateBatchError
from gms.protocol.frame import MESSAGE_SIZE_BYTES_MAX_CEILING
from gms.record import HEADER_SIZE
from gms.record.batch import OneRecord, ParsedRecords, parse_batch, parse_one
from gms.record.codec import decode_record
from gms.record.layout import (
    DELIVER_AT_PROPERTY,
    FLAG_HALF,
    FLAG_SCHEDULED,
    FLAG_SEQUENCED,
    SEQUENCE_PROPERTY,
    TX_GROUP_PROPERTY,
    TX_ID_CHARS_MAX,
    TX_ID_PROPERTY,
)
from gms.record.sequence import STAMP_BYTES, BatchSequence, read_sequence, read_sequences
from gms.store_errors import CorruptRecord, InvalidRecord, MessageTooLarge, UnknownTopic

Admit = Callable[[list[QueueKey]], None]  # sees a batch's queues before anything is written; raises to refuse


class AppendValidator:
    """Parses and checks what an append is given: record format and CRCs, sizes against the
    commitlog file and the topics' limits, the envelope (the broker's to set), flags, delivery
    times, half messages, replicated chunks and queue offsets, idempotent producers' sequences.
    The rules are stated once; a single record (struct) and a batch (numpy) are fed to the same."""

    def __init__(self, config: StoreConfig, topics: TopicTable, producers: ProducerStates) -> None:
        self._config = config
        self._topics = topics
        self._producers = producers

    # --- format ----------------------------------------------------------------------------------
    def parse_batch(self, buf: memoryview, *, replicated: bool, sizes: np.ndarray | None = None) -> ParsedRecords:
        """Records of a batch (CRCs checked, tag hashes too unless replicated) that fit a file."""
        try:
            parsed = parse_batch(buf, self.body_size_max(), self._config.verify_tag_hash and not replicated,
                                 verify_crc=not replicated, sizes=sizes)
        except InvalidRecord as err:
            self._refuse_body(buf, err)
        fits = self._config.record_size_max_bytes
        if len(buf) > fits and int(parsed.sizes.max()) > fits:
            self._refuse_size(int(parsed.sizes.max()))
        return parsed

    @staticmethod
    def check_chunk(records: bytes | bytearray | memoryview, crc32: int) -> None:
        """Replicated records are the leader's bytes: their CRC as a whole is the leader's."""
        if chunk_crc32(records) != crc32:
            raise CorruptRecord(0, f"replicated chunk of {len(records)} bytes does not match the leader's CRC")

    def _refuse_size(self, size: int) -> NoReturn:
        raise InvalidRecord("record", f"{size} bytes cannot fit a commitlog file of "
                                      f"{self._config.commitlog_file_size_bytes} bytes")

    def body_size_max(self) -> int:
        """The body limit a record is parsed with: ``body_size_max_bytes``, or the largest topic's
        ``message_size_bytes_max`` when that is larger (then each record is held to its own topic's
        limit by :meth:`check_batch`)."""
        return max(self._config.body_size_max_bytes, self._topics.message_size_max)

    def _refuse_body(self, buf: memoryview, err: InvalidRecord) -> NoReturn:
        """Raise ``err``, a batch's parse failure, unless it is a body over the limits of the topics
        here in a batch naming a topic not here yet (created a moment ago, with a larger
        ``message_size_bytes_max``): that is UnknownTopic, which senders retry, not a refusal."""
        if err.field == "body":
            try:
                topics = parse_batch(buf, MESSAGE_SIZE_BYTES_MAX_CEILING, False, verify_crc=False).topics
            except InvalidRecord:
                raise err from None
            for topic in topics:
                if self._topics.get(topic) is None:
                    raise UnknownTopic(topic) from err
        raise err

    # --- a producer's records --------------------------------------------------------------------
    def check_one(self, buf: memoryview, allowed_flags: int) -> OneRecord:
        """A producer's single record, parsed with struct instead of numpy and held to the rules
        of :meth:`parse_batch` and :meth:`check_batch` (the common case costs a comparison each)."""
        try:
            record = parse_one(buf, self.body_size_max(), self._config.verify_tag_hash)
        except InvalidRecord as err:
            self._refuse_body(buf, err)
        size = record.size
        if size > self._config.record_size_max_bytes:
            self._refuse_size(size)
        limit = self._topics.limits(record.topic).message_size_bytes_max or self._default_limit(0)
        unstamped = size - STAMP_BYTES if record.flags & FLAG_SEQUENCED else size
        if limit and unstamped > limit:
            raise MessageTooLarge(record.topic, unstamped, limit)
        if record.stamped or record.flags:
            self._check_sent(buf, record.stamped, record.flags, allowed_flags)
        return record

    def check_batch(self, buf: memoryview, parsed: ParsedRecords, flag_union: int, allowed_flags: int) -> None:
        """A producer's batch: each record against its topic's size limit (nothing to compare when
        the whole batch is within the smallest limit, the usual case), then :meth:`_check_sent`."""
        per_topic = [self._topics.limits(t).message_size_bytes_max or self._default_limit(len(buf))
                     for t in parsed.topics]
        if len(buf) > min(per_topic):
            limits = np.array(per_topic, np.int64)
            # an idempotent producer's stamp is the broker's, not the message's: it does not count
            stamps = np.where(parsed.headers["flags"] & FLAG_SEQUENCED, STAMP_BYTES, 0)
            sizes = parsed.sizes
            over = np.flatnonzero(sizes - stamps > limits[parsed.topic_index])
            if over.size:
                i = int(over[0])
                raise MessageTooLarge(parsed.topics[parsed.topic_index[i]], int(sizes[i] - stamps[i]),
                                      int(limits[parsed.topic_index[i]]))
        stamped = bool((parsed.headers["phys_offset"] | parsed.headers["store_ts_ms"]).any())
        self._check_sent(buf, stamped, flag_union, allowed_flags, parsed)

    def _default_limit(self, unchecked: int) -> int:
        """The record limit of a topic without its own ``message_size_bytes_max``: ``unchecked``
        (the parse's body check was ``body_size_max_bytes``) unless a topic's larger limit raised
        that check; then ``body_size_max_bytes``, counted as stored."""
        return unchecked if self._topics.message_size_max <= self._config.body_size_max_bytes \
            else self._config.body_size_max_bytes

    def _check_sent(self, buf: memoryview, stamped: bool, flag_union: int, allowed_flags: int,
                    parsed: ParsedRecords | None = None) -> None:
        """What a producer may not set: the envelope (recovery knows a finished append by the one
        it patches in), flags beyond ``allowed_flags``; scheduled records need a delivery time, half
        messages their transaction. ``parsed``: the batch's records (None: one record at 0)."""
        if stamped:
            raise InvalidRecord("envelope", "phys_offset and store_ts_ms are set by the broker: send zeros")
        if not flag_union:
            return
        if flag_union & ~allowed_flags:
            raise InvalidRecord("flags", f"only flags {allowed_flags:#x} may be sent")
        if flag_union & FLAG_SCHEDULED:
            self._check_delivery_times(buf, _flagged_starts(parsed, FLAG_SCHEDULED))
        if flag_union & FLAG_HALF:
            _check_halves(buf, _flagged_starts(parsed, FLAG_HALF))

    def _check_delivery_times(self, buf: memoryview, starts: list[int]) -> None:
        """Scheduled records carry a delivery time no further ahead than schedule_max_delay_ms."""
        latest = int(time.time() * 1000) + self._config.schedule_max_delay_ms
        for start in starts:
            raw = decode_record(buf, start, verify_crc=False).properties.get(DELIVER_AT_PROPERTY, "")
            if not raw.lstrip("-").isdigit():
                raise InvalidRecord(DELIVER_AT_PROPERTY, f"a scheduled message needs its delivery time in epoch ms,"
                                                         f" not {raw!r}")
            if int(raw) > latest:
                raise InvalidRecord(DELIVER_AT_PROPERTY, f"delivery more than {self._config.schedule_max_delay_ms}"
                                                         " ms ahead (schedule_max_delay_ms)")

    # --- idempotent producers --------------------------------------------------------------------
    def check_sequences(self, buf: memoryview, parsed: ParsedRecords, groups: list[QueueGroup],
                        counts: list[int]) -> dict[int, BatchSequence]:
        """An idempotent producer's batches: each queue's records one contiguous batch, stamped on
        its first record; the stamps, by the index of the record that carries each. A body of
        several queues' batches (a producer's batches for one broker sent together) is admitted
        whole or not at all: each is checked in body order, and one stored before refuses the body
        (``DuplicateBatchError``: the producer sends each alone, answered with where it is), as
        does any other refusal."""
        flags = parsed.headers["flags"]
        stamped = np.flatnonzero(flags & FLAG_SEQUENCED)
        n = len(flags)
        if len(groups) == 1:
            if len(stamped) != 1 or stamped[0] != 0:
                raise InvalidRecord(SEQUENCE_PROPERTY, "only the first record of a queue's batch carries a"
                                                       " producer sequence")
            cq, _, key = groups[0]
            return {0: self.admit_sequence(buf, cq, key, n)}
        if isinstance(groups[0].indices, slice):  # several groups of records in a row, in body order
            firsts = [cast(slice, idx).start for _, idx, _ in groups]
            in_rows = True
        else:  # index arrays
            indices = [cast(np.ndarray, idx) for _, idx, _ in groups]
            firsts = [int(idx[0]) for idx in indices]
            in_rows = all(int(idx[-1]) - int(idx[0]) + 1 == len(idx) for idx in indices)
        if len(stamped) != len(groups) or set(stamped.tolist()) != set(firsts) or not in_rows:
            raise InvalidRecord(SEQUENCE_PROPERTY, "each queue's records in a send are one batch, in a row,"
                                                   " stamped with a producer sequence on its first record")
        checked = {}
        positions = parsed.starts[firsts].tolist()
        stamps: list[BatchSequence] | list[None] = _read_stamps(buf, parsed, firsts) or [None] * len(firsts)
        # groups of records in a row are slices, in body order (index arrays were refused above)
        for first, count, pos, stamp, (cq, _, key) in zip(firsts, counts, positions, stamps, groups, strict=True):
            try:
                checked[first] = self.admit_sequence(buf, cq, key, count, pos, stamp)
            except DuplicateBatch as duplicate:
                raise DuplicateBatchError(
                    f"{duplicate}; in a send of {len(groups)} queues' batches: nothing was stored, send each"
                    " batch alone", fields={"topic": key[0], "queue_id": key[1]}) from None
        return checked

    def admit_sequence(self, buf: memoryview, cq: ConsumeQueue, key: QueueKey, n: int,
                       pos: int = 0, sequence: BatchSequence | None = None) -> BatchSequence:
        """The stamp of a batch of ``n`` records to ``key`` (its first at ``pos``; ``sequence``:
        read already): refused if out of order or fenced, DuplicateBatch if stored before
        (docs/idempotence.md)."""
        if sequence is None:
            sequence = read_sequence(buf, pos)
        if sequence.records != n:
            raise InvalidRecord(SEQUENCE_PROPERTY, f"the batch holds {n} records, its sequence says {sequence.records}")
        known = self._producers.check(key, sequence, cq.max_offset)
        if known is not None:
            raise DuplicateBatch(key, known.base_offset, known.stored, n)
        return sequence

    # --- replicas ----------------------------------------------------------------------------------
    @staticmethod
    def check_replicated_offsets(groups: list[QueueGroup], parsed: ParsedRecords) -> np.ndarray:
        """The queue offsets replicated records carry, if each queue's continue it exactly."""
        queue_offsets = parsed.headers["queue_offset"].astype(np.int64)
        for cq, idx, key in groups:
            offs = queue_offsets[idx]
            if int(offs[0]) != cq.max_offset or (len(offs) > 1 and (np.diff(offs) != 1).any()):
                raise ReplicaGap(f"queue {key[0]}/{key[1]} ends at {cq.max_offset}; replicated records"
                                 f" carry offsets {int(offs[0])}..{int(offs[-1])} that do not continue it")
        return queue_offsets


def _flagged_starts(parsed: ParsedRecords | None, flag: int) -> list[int]:
    """Where the records carrying ``flag`` start (None: the single record at 0)."""
    if parsed is None:
        return [0]
    return parsed.starts[np.flatnonzero(parsed.headers["flags"] & flag)].tolist()


def _check_halves(buf: memoryview, starts: list[int]) -> None:
    """Half messages name their transaction and producer group, and are not scheduled too
    (docs/transactions.md)."""
    for start in starts:
        record = decode_record(buf, start, verify_crc=False)
        tx_id, group = record.properties.get(TX_ID_PROPERTY, ""), record.properties.get(TX_GROUP_PROPERTY, "")
        if record.flags & FLAG_SCHEDULED:
            raise InvalidRecord("flags", "a half message cannot be scheduled too")
        if not 0 < len(tx_id) <= TX_ID_CHARS_MAX or not group:
            raise InvalidRecord(TX_ID_PROPERTY, f"a half message needs {TX_ID_PROPERTY} (1..{TX_ID_CHARS_MAX} "
                                                f"characters) and {TX_GROUP_PROPERTY}")


def _read_stamps(buf: memoryview, parsed: ParsedRecords, firsts: list[int]) -> list[BatchSequence] | None:
    """The producer sequences stamped on records ``firsts`` (a send of many queues' batches), read
    in one pass; None if any is not where and how a producer stamps it (each is then read alone,
    in body order, which says what is wrong)."""
    headers = parsed.headers[firsts]
    if (headers["props_len"] < STAMP_BYTES).any():
        return None
    ends = parsed.starts[firsts] + HEADER_SIZE
    for length in ("topic_len", "tag_len", "born_host_len", "keys_len", "props_len"):
        ends += headers[length]
    return read_sequences(buf, ends)
