"""The messages of a PULL or FETCH answer's body: walked, checked (length, magic, CRC) and
exact-tag filtered in a few C and numpy calls, with no I/O (the fetcher and the admin calls
that read messages use them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gms.client.structs import MessageBatch, ReceivedMessages
from gms.record import FieldOffsets, RecordCheck, exact_tag_mask, read_field_offsets, scan_records
from gms.store_errors import CorruptRecord
from gms.tags import TagFilter


def decode_pull_body(body: memoryview | bytes | bytearray, prefix: str, tag_filter: TagFilter, *,
                     verify_crc: bool = True) -> ReceivedMessages:
    """Messages of a PULL response body, checked (length, magic, CRC) and exact-tag filtered.

    The records are walked in one C call (:func:`gms.record.scan_records`). ``verify_crc=False``
    checks the framing only: the broker says it checked every record's CRC as it served it
    (``crc_checked``), so the check is paid once per message, not twice. Every header is
    checked as :func:`gms.record.decode_record` checks it (CorruptRecord otherwise)."""
    if not body:
        return ReceivedMessages()
    body = memoryview(body)
    scan = scan_records(body, verify_crc=verify_crc)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
        raise CorruptRecord(scan.stop_pos, f"pull response holds {scan.stop.value} data")
    starts = scan.starts
    offsets = read_field_offsets(body, starts)
    if tag_filter.tags is not None:  # the broker matched tag hashes; drop hash collisions
        keep = exact_tag_mask(body, offsets, tag_filter.tags)
        if not keep.all():
            starts = starts[keep]
            offsets = FieldOffsets(*(column[keep] for column in offsets))
    return ReceivedMessages([MessageBatch(body, starts, prefix, offsets)])


def decode_fetch_body(body: memoryview, spans: Sequence[tuple[int, int, TagFilter]], prefix: str, *,
                      verify_crc: bool) -> tuple[MessageBatch | None, list[int], list[int]] | None:
    """The messages of a FETCH answer's body as one batch, and where each ``(start, end, filter)``
    span's messages start and stop in it, checked as :func:`decode_pull_body` checks them: a
    message batch's columns cost a few numpy calls, paid once per answer instead of once per
    queue. None when the body does not scan whole (then each span is decoded alone, to fail its
    queue only)."""
    if not body:
        return None, [0] * len(spans), [0] * len(spans)
    scan = scan_records(body, verify_crc=verify_crc)
    if scan.stop is not RecordCheck.OK or scan.stop_pos != len(body):
        return None
    starts = scan.starts
    bounds = np.array([edge for start, end, _ in spans for edge in (start, end)], np.int64)
    index = np.searchsorted(starts, bounds)
    # Each span must begin and end on a record boundary (else a row's size lies: decode it alone).
    if not (np.append(starts, len(body))[index] == bounds).all():
        return None
    try:
        offsets = read_field_offsets(body, starts)
    except CorruptRecord:
        return None
    keep: np.ndarray | None = None
    for (_, _, tag_filter), first, last in zip(spans, index[0::2].tolist(), index[1::2].tolist(), strict=True):
        if tag_filter.tags is not None and last > first:  # the broker matched tag hashes; drop collisions
            span = exact_tag_mask(body, FieldOffsets(*(column[first:last] for column in offsets)), tag_filter.tags)
            if not span.all():
                if keep is None:
                    keep = np.ones(len(starts), bool)
                keep[first:last] = span
    if keep is not None:
        starts = starts[keep]
        offsets = FieldOffsets(*(column[keep] for column in offsets))
        index = np.concatenate(([0], np.cumsum(keep)))[index]
    firsts, lasts = index[0::2], index[1::2]
    # Each record's span (a queue: one topic), whose topic is then decoded once (records of no
    # span, rows dropped since they were asked for, are never read).
    batch = MessageBatch(body, starts, prefix, offsets, np.searchsorted(lasts, np.arange(len(starts)), "right"))
    return batch, firsts.tolist(), lasts.tolist()
