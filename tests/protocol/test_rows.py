"""The wire row schemas (gms.protocol.rows): rows round-trip, rows of an older or newer peer still
decode, the rows written are the lists earlier versions wrote (byte for byte), and
docs/protocol.md's row tables are the ones the schemas give."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest

from gms.errors import BadRequestError
from gms.protocol import docs
from gms.protocol.fetch import (
    FETCHED_QUEUE,
    FetchedQueue,
    FetchRequest,
    QueueFetch,
    decode_fetch_answer,
    decode_fetch_request,
)
from gms.protocol.groups import QUEUE_REF, ExpiredHandle, QueueOffset, QueueRef, TransactionQueue, queue_offsets
from gms.protocol.replication import (
    EpochAnswer,
    EpochEntry,
    EpochQuery,
    FetchedRange,
    FetchWant,
    GroupCommit,
    OffsetRun,
    RepairedQueue,
    RepairedRecord,
    RepairWant,
    offset_runs,
)
from gms.protocol.rows import decode, encode

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _packed(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _received(row: list) -> list:
    """``row`` as the peer's decoder hands it over (tuples become lists, bytes stay bytes)."""
    return msgpack.unpackb(_packed(row), raw=False)


FULL = FetchedRange("t", 3, 0, 10, 12, 300, (EpochEntry(4, 7),), (GroupCommit("g", 9), GroupCommit("p", 5, [1, [2]])),
                    0xFFFF_FFFF, np.array([100, 200], ">i4").tobytes(), 2, (OffsetRun(10, 2),))

ROWS = [
    FULL,
    FetchWant("t", 0, 5, 2, 1, 7),
    RepairWant("t", 1, 2, [4, 5]),
    RepairedQueue("t", 1, 0, (RepairedRecord(4, 10, 99), RepairedRecord(5, 0, 0))),
    EpochQuery("t", 1, 3, 2),
    EpochAnswer("t", 1, 0, 2, 40),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: type(r).__name__)
def test_rows_round_trip(row):
    assert decode(type(row), _received(list(encode(row)))) == row


def test_answer_rows_are_the_lists_earlier_brokers_wrote():
    """The same msgpack bytes as the positional lists the leader built before the schemas."""
    sizes = np.array([100, 200], ">i4").tobytes()
    refused = ["t", 3, 6, 0, 0, 0, [], [], 0, b""]
    assert _packed(encode(FetchedRange("t", 3, 6, 0, 0, 0, (), (), 0))) == _packed(refused)
    plain = ["t", 3, 0, 10, 12, 300, [[4, 7]], [["g", 9]], 5, sizes, 0]
    row = FetchedRange("t", 3, 0, 10, 12, 300, (EpochEntry(4, 7),), (GroupCommit("g", 9),), 5, sizes, 0)
    assert _packed(encode(row)) == _packed(plain)
    damaged = [*plain, [[10, 2]]]
    assert _packed(encode(decode(FetchedRange, _received(damaged)))) == _packed(damaged)
    assert encode(GroupCommit("p", 5, [1])) == ("p", 5, [1]) and encode(GroupCommit("p", 5)) == ("p", 5)
    assert encode(FetchWant("t", 0, 5, 2, 1, 0)) == ("t", 0, 5, 2, 1, 0)  # a required-looking 0 stays
    assert _packed(encode(RepairedQueue("t", 1, 6, ()))) == _packed(["t", 1, 6, []])


def test_rows_of_an_older_broker_decode_with_defaults():
    before_sizes = decode(FetchedRange, ["t", 3, 0, 10, 12, 0, [], [["g", 1]], 0])
    assert (before_sizes.sizes, before_sizes.record_sizes(), before_sizes.log_start) == (b"", None, None)
    assert before_sizes.commits == (GroupCommit("g", 1),) and len(before_sizes.damaged_offsets()) == 0
    before_damage = decode(FetchedRange, ["t", 3, 0, 10, 12, 0, [], [], 0, b"", 4])
    assert (before_damage.log_start, before_damage.damaged) == (4, ())
    assert decode(FetchWant, ["t", 0, 5, 2, 1]).offsets_seq == 0


def test_answer_rows_of_a_newer_broker_drop_what_they_do_not_know():
    assert decode(FetchedRange, [*_received(list(encode(FULL))), "later"]) == FULL
    assert decode(EpochAnswer, ["t", 1, 0, 2, 40, 7]) == EpochAnswer("t", 1, 0, 2, 40)


@pytest.mark.parametrize("row, message", [
    (["t", 0, 5, 2], "'queues' must hold rows of [topic, queue_id, fetch_offset, leader_epoch, last_epoch"),
    (["t", 0, 5, 2, 1, 0, 9], "must hold rows of"),
    ([1, 0, 5, 2, 1], "must hold rows of"),
    (["t", 1 << 31, 5, 2, 1], "'queues: queue_id' is 2147483648, outside int32"),
    (["t", 0, True, 2, 1], "'queues: fetch_offset' must be int, not bool"),
])
def test_bad_request_rows_name_what_is_wrong(row, message):
    with pytest.raises(BadRequestError) as caught:
        decode(FetchWant, row, "queues")
    assert message in str(caught.value)


@pytest.mark.parametrize("row, message", [
    (["t", 0], "'queues' must hold rows of [topic, queue_id, offset]"),
    (["t", 0, 5, 1], "must hold rows of"),
    ([b"t", 0, 5], "must hold rows of"),
    (("t", 0, 5), "must hold rows of"),
    (["t", 1 << 31, 5], "'queues: queue_id' is 2147483648, outside int32"),
    (["t", True, 5], "'queues: queue_id' must be int, not bool"),
    (["t", 0, 1 << 63], "'queues: offset' is 9223372036854775808, outside int64"),
])
def test_a_fetch_names_its_queues_in_rows_checked_as_their_schema_checks_them(row, message):
    """Well-formed rows are taken as they are (a FETCH names thousands); any other is refused
    with the schema's own message, wherever it is among them."""
    request = FetchRequest([QueueFetch("t", 0, 5), QueueFetch("u", 3, -1)], {}, 10, 1000, 10_000, 0, "", "")
    fields = msgpack.unpackb(_packed(request.fields()))
    assert decode_fetch_request(fields, 1000).queues == request.queues
    fields["queues"].insert(1, row)
    with pytest.raises(BadRequestError) as caught:
        decode_fetch_request(fields, 1000)
    assert message in str(caught.value)


def test_a_fetch_answer_s_rows_decode_as_their_schema_decodes_them():
    rows = [FetchedQueue("t", 1, 0, 5, 0, 9, 30, "", ((3, 70),)), FetchedQueue("u", 0, 1, 7, 2, 8, 0, "out of range"),
            FetchedQueue("v", 2, 0, 1 << 40, 0, 1 << 40, 12)]
    fields = msgpack.unpackb(_packed({"queues": [row.row() for row in rows]}))
    got = decode_fetch_answer(fields, 42)
    assert got == [FETCHED_QUEUE.decode(row, "queues") for row in fields["queues"]]
    assert [tuple(row[:7]) for row in got] == [tuple(row[:7]) for row in rows] and got[0].damaged == [[3, 70]]
    for bad, message in [(["t", 1, 0, 5, 0, 9, True, "", []], "'queues: size' must be int, not bool"),
                         (["t", 1 << 31, 0, 5, 0, 9, 30, "", []], "'queues: queue_id' is 2147483648, outside int32"),
                         (["t", 1, 0, 5, 0, 9, 30, ""], "must hold rows of")]:
        with pytest.raises(BadRequestError, match=message):
            decode_fetch_answer({"queues": [*fields["queues"], bad]}, 42 + 30)


def test_nested_rows_are_checked_too():
    with pytest.raises(BadRequestError, match="'repair: offsets' must be int"):
        decode(RepairWant, ["t", 0, 1, [1, "2"]], "repair")
    with pytest.raises(BadRequestError, match="'row: commits' must hold rows of"):
        decode(FetchedRange, ["t", 3, 0, 10, 12, 0, [], [["g"]], 0])


def test_offset_runs_round_trip():
    offsets = np.array([3, 4, 5, 9, 11, 12], np.int64)
    runs = offset_runs(offsets)
    assert runs == (OffsetRun(3, 3), OffsetRun(9, 1), OffsetRun(11, 2))
    row = FetchedRange("t", 0, 0, 0, 0, 0, (), (), 0, b"", 0, runs)
    assert decode(FetchedRange, _received(list(encode(row)))).damaged_offsets().tolist() == offsets.tolist()


def test_namedtuple_rows_keep_their_wire_lists():
    assert encode(QueueRef("t", 2)) == ("t", 2) and QUEUE_REF.decode(["t", 2], "queues") == QueueRef("t", 2)
    assert queue_offsets({"offsets": [["t", 2, 9]]}, "offsets") == [QueueOffset("t", 2, 9)]
    assert decode(ExpiredHandle, _received(list(encode(ExpiredHandle(3, 70))))) == (3, 70)
    assert decode(TransactionQueue, ["t", 1, 4]) == TransactionQueue("t", 1, 4)
    with pytest.raises(BadRequestError, match=r"'expired' must hold rows of \[queue_id, offset\]"):
        decode(ExpiredHandle, [3], "expired")
    fetched = FetchedQueue("t", 1, 0, 5, 0, 9, 30, "", ((3, 70),))
    assert _packed(fetched.row()) == _packed(["t", 1, 0, 5, 0, 9, 30, "", [[3, 70]]])
    assert FETCHED_QUEUE.decode(_received(fetched.row()), "queues").damaged == [[3, 70]]


def test_protocol_doc_row_tables_are_current():
    """Fails when a schema changed and docs/protocol.md was not regenerated:
    run ``python -m gms.protocol.docs``."""
    text = PROTOCOL_MD.read_text()
    assert docs.updated(text) == text
    assert docs.main([str(PROTOCOL_MD), "--check"]) == 0


def test_the_doc_check_fails_on_a_stale_table(tmp_path):
    stale = tmp_path / "protocol.md"
    stale.write_text(PROTOCOL_MD.read_text().replace("| `hw` | int64 |", "| `hw` | int32 |"))
    assert docs.main([str(stale), "--check"]) == 1
    assert docs.main([str(stale)]) == 0 and stale.read_text() == PROTOCOL_MD.read_text()
