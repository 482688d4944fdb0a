"""Record format v1: the one layout shared by producer, broker store, consumer and Spark.

Big-endian. The first 40 bytes are the envelope the broker owns (it may rewrite them without
touching the checksum); bytes from 40 on are written by the producer and covered by the CRC,
like Kafka's v2 batch keeps base offset and leader epoch outside its CRC::

    off size field
    0   4   total_size      i32  whole record including this field
    4   4   magic           u32  MAGIC_V1 (BLANK_MAGIC marks end-of-file filler)
    8   4   crc32           u32  crc32 of bytes [40, total_size)
    12  4   queue_id        i32  broker may rewrite
    16  8   queue_offset    i64  broker-assigned
    24  8   phys_offset     i64  broker-assigned (commitlog offset of this record)
    32  8   store_ts_ms     i64  broker-assigned
    --- CRC-covered, written by the producer ---
    40  4   flags           i32
    44  8   born_ts_ms      i64
    52  8   tag_hash        i64  xxhash64(tag utf-8) as signed int64; 0 = no tag
    60  4   reconsume_times i32
    64  4   body_len        i32
    68  1   topic_len       u8   1..127
    69  1   tag_len         u8
    70  1   born_host_len   u8
    71  1   reserved        u8   0
    72  2   keys_len        u16  keys, utf-8, separated by KEY_SEPARATOR
    74  2   props_len       u16  properties, utf-8 "k\\x01v\\x02k\\x01v\\x02"
    76  ... topic, tag, born_host, keys, properties, body

A commitlog file ends with a blank marker (total_size = bytes left in the file, BLANK_MAGIC);
a record is placed in a file only if it leaves at least BLANK_MARKER_SIZE bytes after it.
"""

from __future__ import annotations

import enum
import struct
from itertools import accumulate

import numpy as np
import xxhash

MAGIC_V1 = 0x474D5301  # "GMS\x01"
BLANK_MAGIC = 0x474D53FF  # "GMS\xff": filler up to the end of a commitlog file
BLANK_MARKER_SIZE = 8  # total_size + magic; RocketMQ's END_FILE_MIN_BLANK_LENGTH

KEY_SEPARATOR = " "
PROP_NAME_VALUE_SEPARATOR = "\x01"
PROP_SEPARATOR = "\x02"

# (name, struct code): the fixed part, in order. Offsets are derived, never typed by hand.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("total_size", "i"),
    ("magic", "I"),
    ("crc32", "I"),
    ("queue_id", "i"),
    ("queue_offset", "q"),
    ("phys_offset", "q"),
    ("store_ts_ms", "q"),
    ("flags", "i"),
    ("born_ts_ms", "q"),
    ("tag_hash", "q"),
    ("reconsume_times", "i"),
    ("body_len", "i"),
    ("topic_len", "B"),
    ("tag_len", "B"),
    ("born_host_len", "B"),
    ("reserved", "B"),
    ("keys_len", "H"),
    ("props_len", "H"),
)
HEADER = struct.Struct(">" + "".join(code for _, code in _FIELDS))
HEADER_SIZE = HEADER.size
OFFSETS: dict[str, int] = dict(
    # accumulate(initial=0) yields one more (the end) than there are fields: not strict.
    zip((name for name, _ in _FIELDS), accumulate((struct.calcsize(">" + c) for _, c in _FIELDS), initial=0),
        strict=False)
)
OFF_MAGIC = OFFSETS["magic"]
OFF_CRC = OFFSETS["crc32"]
OFF_QUEUE_ID = OFFSETS["queue_id"]
OFF_QUEUE_OFFSET = OFFSETS["queue_offset"]
OFF_PHYS_OFFSET = OFFSETS["phys_offset"]
OFF_STORE_TS = OFFSETS["store_ts_ms"]
OFF_CRC_START = OFFSETS["flags"]  # the CRC covers [OFF_CRC_START, total_size)
OFF_TAG_HASH = OFFSETS["tag_hash"]
OFF_VARIABLE = HEADER_SIZE

assert HEADER_SIZE == 76, HEADER_SIZE
assert (OFF_MAGIC, OFF_CRC, OFF_QUEUE_ID, OFF_QUEUE_OFFSET) == (4, 8, 12, 16)
assert (OFF_PHYS_OFFSET, OFF_STORE_TS, OFF_CRC_START, OFF_TAG_HASH) == (24, 32, 40, 52)
assert OFFSETS["body_len"] == 64 and OFFSETS["topic_len"] == 68 and OFFSETS["props_len"] == 74

# The same fixed part as a numpy dtype, for reading the headers of a whole batch at once.
HEADER_DTYPE = np.dtype([(name, ">" + ("u" if c in "IBH" else "i") + str(struct.calcsize(c)))
                         for name, c in ((n, c) for n, c in _FIELDS)])
assert HEADER_DTYPE.itemsize == HEADER_SIZE


TAG_BYTES_MAX = 255
BORN_HOST_BYTES_MAX = 255
KEYS_BYTES_MAX = 0xFFFF
PROPS_BYTES_MAX = 0xFFFF
RECORD_BYTES_MAX = 0x7FFFFFFF
NO_TAG_HASH = 0

# Record flags (the CRC-covered ``flags`` field). Scheduled messages (docs/scheduled-messages.md)
# are stored in their queue at once but hidden from consumers; at their time the broker appends a
# visible copy. Producers may set FLAG_SCHEDULED, FLAG_HALF and FLAG_SEQUENCED only; the broker
# writes the copy and cancel flags.
FLAG_SCHEDULED = 0x1  # deliver at the time in property DELIVER_AT_PROPERTY: hidden until then
FLAG_TIMER_COPY = 0x2  # the delivered copy of the scheduled message ORIGIN_PROPERTY names
FLAG_TIMER_CANCEL = 0x4  # hidden: the scheduled message ORIGIN_PROPERTY names is cancelled
FLAG_SEQUENCED = 0x8  # the first record of an idempotent producer's batch (docs/idempotence.md)
FLAG_HALF = 0x10  # a transaction's half message: hidden until committed (docs/transactions.md)
# Half messages ride on the timer's records: pending (with no time) until the leader appends their
# copies (commit) or cancels (rollback), both carrying TX_ID_PROPERTY.
HIDDEN_FLAGS = FLAG_SCHEDULED | FLAG_TIMER_CANCEL | FLAG_HALF
TIMER_FLAGS = FLAG_SCHEDULED | FLAG_TIMER_COPY | FLAG_TIMER_CANCEL | FLAG_HALF
PRODUCER_FLAGS = FLAG_SCHEDULED | FLAG_HALF | FLAG_SEQUENCED
DELIVER_AT_PROPERTY = "__DELIVER_AT_MS"
MESSAGE_GROUP_PROPERTY = "__MESSAGE_GROUP"  # FIFO order within the group (docs/fifo.md)
ORIGIN_PROPERTY = "__TIMER_ORIGIN"  # the queue offset of the scheduled message
# A compacted topic's tombstone: its key is deleted (docs/storage-format.md "Compacted topics").
TOMBSTONE_PROPERTY = "__TOMBSTONE"
# A Kafka record key that is not one word of text (gms.broker.kafka.convert.KEY_PROPERTY).
KAFKA_KEY_PROPERTY = "__KAFKA_KEY"
TX_ID_PROPERTY = "__TX_ID"  # a half message's transaction (kept by its copy and its cancel)
TX_GROUP_PROPERTY = "__TX_GROUP"  # the producer group asked to resolve it (check-back)
TX_TIMEOUT_PROPERTY = "__TX_TIMEOUT_MS"  # optional: ms before its first check-back
TX_ID_CHARS_MAX = 128
# An idempotent producer's batch stamp (record.sequence): the brokers' business, never shown as a
# message property (decode_properties leaves it out).
SEQUENCE_PROPERTY = "__PRODUCER_SEQ"
# The consumeQueue tag hash of a hidden record: consumers skip these entries without reading the
# commitlog. Chosen outside what tag_hash() gives in practice (a collision would hide a message
# with that one tag hash: probability 2**-64 per distinct tag).
HIDDEN_TAG_HASH = -0x7FFF_FFFF_FFFF_FFF1


def index_tag_hashes(headers: np.ndarray) -> np.ndarray:
    """The consumeQueue tag hash column of records: their tag hash, HIDDEN_TAG_HASH for hidden ones."""
    hashes = headers["tag_hash"]
    hidden = (headers["flags"] & HIDDEN_FLAGS) != 0
    if not hidden.any():
        return hashes
    return np.where(hidden, np.int64(HIDDEN_TAG_HASH), hashes.astype(np.int64))


def index_tag_hash(flags: int, record_tag_hash: int) -> int:
    """:func:`index_tag_hashes` of one record."""
    return HIDDEN_TAG_HASH if flags & HIDDEN_FLAGS else record_tag_hash


class RecordCheck(enum.Enum):
    """What lies at a position of a commitlog file (RocketMQ's checkMessageAndReturnSize)."""

    OK = "ok"  # a valid record
    BLANK = "blank"  # end-of-file filler: the rest of the file holds no record
    EMPTY = "empty"  # zeros: nothing was ever written here
    TRUNCATED = "truncated"  # a record header promises more bytes than there are
    CORRUPT = "corrupt"  # bad magic, impossible length or CRC mismatch


def tag_hash(tag: str | None) -> int:
    """xxhash64 of the tag's utf-8 bytes as a signed int64 (the consumeQueue column); 0 = no tag."""
    if not tag:
        return NO_TAG_HASH
    h = xxhash.xxh64_intdigest(tag.encode())
    return h - (1 << 64) if h >= (1 << 63) else h
