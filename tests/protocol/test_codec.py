"""Round trips and framing of the sans-IO codec."""

from __future__ import annotations

import struct

import msgpack
import pytest
from codec_helpers import drain, encode, read_into

from gms.errors import FrameTooLargeError, MalformedFrameError, ProtocolError
from gms.protocol.codes import Flag, RequestCode, Status
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import (
    BODY_SIZE_MAX_BYTES,
    FRAME_SIZE_MAX_BYTES,
    HEADER_SIZE_MAX_BYTES,
    PREFIX,
    Frame,
    encode_frame,
)


def raw_frame(header: object, body: bytes = b"") -> bytes:
    header_bytes = msgpack.packb(header)
    return PREFIX.pack(4 + len(header_bytes) + len(body), len(header_bytes)) + header_bytes + body


def test_round_trip_all_header_fields(decoder: FrameDecoder) -> None:
    fields = {"topic": "orders", "queue_id": 3, "offset": 2**40, "tags": ["A", "B"]}
    decoder.feed(
        encode(
            RequestCode.PULL,
            2**33,
            flags=Flag.RESPONSE,
            status=Status.TOPIC_NOT_FOUND,
            error="no topic orders",
            fields=fields,
            body=b"payload",
        )
    )
    frame = decoder.next_frame()
    assert isinstance(frame, Frame)
    assert (frame.code, frame.request_id, frame.flags, frame.status, frame.error) == (
        RequestCode.PULL,
        2**33,
        Flag.RESPONSE,
        Status.TOPIC_NOT_FOUND,
        "no topic orders",
    )
    assert frame.fields == fields
    assert bytes(frame.body) == b"payload"
    assert frame.is_response and not frame.is_oneway
    assert decoder.next_frame() is Event.NEED_DATA


def test_defaults_are_left_out_of_the_header() -> None:
    first = encode_frame(RequestCode.PING, 5)[0]
    assert msgpack.unpackb(bytes(first)[8:]) == {"code": 1, "id": 5}


def test_body_parts_pass_through_without_copy() -> None:
    records = [memoryview(bytearray(b"x" * 100)) for _ in range(50)]
    parts = encode_frame(RequestCode.SEND_BATCH, 1, body=records)
    assert all(a is b for a, b in zip(parts[1:], records, strict=True))
    frame_length, header_length = PREFIX.unpack_from(parts[0])
    assert frame_length == 4 + header_length + 5000


def test_empty_body_parts_are_dropped(decoder: FrameDecoder) -> None:
    parts = encode_frame(RequestCode.SEND, 1, body=[b"", b"ab", memoryview(b""), b"c"])
    assert len(parts) == 3
    decoder.feed(b"".join(parts))
    assert bytes(decoder.next_frame().body) == b"abc"  # type: ignore[union-attr]


def test_split_at_every_byte_boundary() -> None:
    data = encode(body=b"0123456789", fields={"k": "v"}) + encode(request_id=2, body=b"z")
    for cut in range(1, len(data)):
        decoder = FrameDecoder()
        decoder.feed(data[:cut])
        frames = drain(decoder)
        decoder.feed(data[cut:])
        frames += drain(decoder)
        assert [(f.request_id, bytes(f.body)) for f in frames] == [(1, b"0123456789"), (2, b"z")]


def test_one_byte_at_a_time() -> None:
    data = encode(body=b"abc" * 1000)
    decoder = FrameDecoder()
    frames = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        frames += drain(decoder)
    assert len(frames) == 1 and bytes(frames[0].body) == b"abc" * 1000
    assert decoder.buffered_bytes == 0


def test_many_frames_in_one_chunk_are_views_of_it(decoder: FrameDecoder) -> None:
    data = b"".join(encode(request_id=i, body=str(i).encode()) for i in range(1000))
    decoder.feed(data)
    frames = drain(decoder)
    assert [bytes(f.body) for f in frames] == [str(i).encode() for i in range(1000)]
    assert all(isinstance(f.body, memoryview) and f.body.readonly for f in frames)
    assert frames[0].body.obj is data  # type: ignore[union-attr]


def test_assembled_body_is_not_overwritten_by_later_frames(decoder: FrameDecoder) -> None:
    first, second = encode(body=b"A" * 100), encode(request_id=2, body=b"B" * 100)
    decoder.feed(first[:50])
    decoder.feed(first[50:] + second[:50])
    frame = decoder.next_frame()
    decoder.feed(second[50:])
    assert bytes(drain(decoder)[0].body) == b"B" * 100
    assert bytes(frame.body) == b"A" * 100  # type: ignore[union-attr]


def test_frames_left_unread_across_feeds_keep_their_order(decoder: FrameDecoder) -> None:
    for i in range(10):
        decoder.feed(encode(request_id=i)[:7])
        decoder.feed(encode(request_id=i)[7:])
    assert [f.request_id for f in drain(decoder)] == list(range(10))


def test_end_of_stream_between_frames(decoder: FrameDecoder) -> None:
    decoder.feed(encode())
    decoder.feed(b"")
    assert isinstance(decoder.next_frame(), Frame)
    assert decoder.next_frame() is Event.CLOSED
    with pytest.raises(RuntimeError):
        decoder.feed(b"x")


def test_end_of_stream_inside_a_frame(decoder: FrameDecoder) -> None:
    decoder.feed(encode()[:-1])
    decoder.feed(b"")
    with pytest.raises(MalformedFrameError) as info:
        decoder.next_frame()
    assert info.value.must_close


@pytest.mark.parametrize(
    ("prefix", "error"),
    [
        (PREFIX.pack(FRAME_SIZE_MAX_BYTES, 10), FrameTooLargeError),
        (PREFIX.pack(2**32 - 1, 10), FrameTooLargeError),
        (PREFIX.pack(100, HEADER_SIZE_MAX_BYTES + 1), FrameTooLargeError),
        (PREFIX.pack(10, 7), MalformedFrameError),  # header longer than the frame
        (PREFIX.pack(0, 0), MalformedFrameError),
        (PREFIX.pack(10, 0), MalformedFrameError),  # empty header
    ],
)
def test_bad_lengths_are_fatal(
    decoder: FrameDecoder, prefix: bytes, error: type[ProtocolError]
) -> None:
    decoder.feed(prefix)
    with pytest.raises(error) as info:
        decoder.next_frame()
    assert info.value.must_close
    assert info.value.status in (Status.FRAME_TOO_LARGE, Status.MALFORMED_FRAME)
    with pytest.raises(error):  # the decoder stays failed
        decoder.next_frame()


def test_oversized_frame_rejected_from_its_prefix_alone() -> None:
    decoder = FrameDecoder(frame_size_max_bytes=1024)
    decoder.feed(PREFIX.pack(2000, 10))
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()


@pytest.mark.parametrize(
    ("header", "request_id"),
    [
        ([1, 2], None),
        ("text", None),
        ({"code": 1}, None),
        ({"code": 1, "id": -1}, None),
        ({"code": 1, "id": "7"}, None),
        ({"code": "send", "id": 7}, 7),
        ({"code": 1, "id": 7, "flags": "x"}, 7),
        ({"code": 1, "id": 7, "status": 1.5}, 7),
        ({"code": 1, "id": 7, "error": 3}, 7),
        ({"code": 1, "id": 7, "fields": [1]}, 7),
        ({"code": True, "id": 7}, 7),
    ],
)
def test_bad_header_skips_the_frame_and_keeps_the_stream(
    decoder: FrameDecoder, header: object, request_id: int | None
) -> None:
    decoder.feed(raw_frame(header, b"body") + encode(request_id=9))
    with pytest.raises(MalformedFrameError) as info:
        decoder.next_frame()
    assert not info.value.must_close
    assert info.value.request_id == request_id
    assert [f.request_id for f in drain(decoder)] == [9]


def test_header_that_is_not_msgpack(decoder: FrameDecoder) -> None:
    bad = b"\xc1\xc1\xc1"  # 0xc1 is never used in msgpack
    decoder.feed(PREFIX.pack(4 + len(bad), len(bad)) + bad + encode(request_id=3))
    with pytest.raises(MalformedFrameError):
        decoder.next_frame()
    assert [f.request_id for f in drain(decoder)] == [3]


def test_unknown_header_keys_are_ignored(decoder: FrameDecoder) -> None:
    decoder.feed(raw_frame({"code": 1, "id": 2, "future": [1, 2]}))
    assert decoder.next_frame().request_id == 2  # type: ignore[union-attr]


def test_encoder_refuses_frames_the_peer_would_refuse() -> None:
    with pytest.raises(FrameTooLargeError) as info:
        encode_frame(RequestCode.SEND, 4, body=b"x" * 2000, frame_size_max_bytes=1000)
    assert not info.value.must_close and info.value.request_id == 4
    with pytest.raises(FrameTooLargeError):
        encode_frame(RequestCode.SEND, 4, fields={"k": "x" * (HEADER_SIZE_MAX_BYTES + 1)})


def test_largest_allowed_body_fits_the_frame_limit() -> None:
    body = memoryview(bytes(BODY_SIZE_MAX_BYTES))
    parts = encode_frame(RequestCode.SEND_BATCH, 1, fields={"topic": "t" * 200}, body=body)
    assert PREFIX.unpack_from(parts[0])[0] + 4 <= FRAME_SIZE_MAX_BYTES
    decoder = FrameDecoder()
    decoder.feed(bytes(parts[0]))
    decoder.feed(body.tobytes())
    assert drain(decoder)[0].body.nbytes == BODY_SIZE_MAX_BYTES  # type: ignore[union-attr]


def test_prefix_is_big_endian() -> None:
    first = bytes(encode_frame(RequestCode.PING, 1, body=b"abc")[0])
    assert struct.unpack(">I", first[:4])[0] == len(first) - 4 + 3


# --- a receiver reading straight into the decoder (get_buffer / buffer_updated) -----------------


@pytest.mark.parametrize("read_size", [1, 7, None])
def test_reading_split_at_every_byte_boundary(read_size: int | None) -> None:
    data = encode(body=b"0123456789", fields={"k": "v"}) + encode(request_id=2, body=b"z")
    for cut in range(1, len(data)):
        decoder = FrameDecoder()
        read_into(decoder, data[:cut], read_size)
        frames = drain(decoder)
        read_into(decoder, data[cut:], read_size)
        frames += drain(decoder)
        assert [(f.request_id, bytes(f.body)) for f in frames] == [(1, b"0123456789"), (2, b"z")]
        assert decoder.buffered_bytes == 0 and decoder.reserved_bytes == 0


def test_a_huge_frame_is_read_into_one_buffer_of_its_size_and_never_copied() -> None:
    body = bytes(range(256)) * 12_000  # 3 MB: many times the receive buffer
    data = encode(request_id=1, body=b"small") + encode(request_id=2, body=body) + encode(request_id=3)
    decoder = FrameDecoder()
    written_to = set()
    frames = []
    while data:
        buffer = decoder.get_buffer(-1)
        n = min(len(buffer), len(data), 65536)
        buffer[:n] = data[:n]
        written_to.add(id(buffer.obj))
        decoder.buffer_updated(n)
        data = data[n:]
        frames += drain(decoder)
        if frames and frames[-1].request_id == 1 and len(frames) == 1:
            assert decoder.reserved_bytes >= len(body)  # the huge frame's prefix is in: committed to it
    assert [(f.request_id, bytes(f.body)) for f in frames] == [(1, b"small"), (2, body), (3, b"")]
    assert frames[1].body.readonly and len(frames[1].body.obj) == len(encode(request_id=2, body=body))
    assert len(written_to) <= 3  # the first buffer, the huge frame's own, one after it


def test_frames_read_earlier_are_never_overwritten() -> None:
    decoder = FrameDecoder()
    kept = []
    for i in range(2000):  # ~ 4 MB through buffers that fill up and are replaced
        read_into(decoder, encode(request_id=i, body=bytes([i % 256]) * 2000), 3000)
        kept += drain(decoder)
    assert [f.request_id for f in kept] == list(range(2000))
    assert all(bytes(f.body) == bytes([f.request_id % 256]) * 2000 for f in kept)


def test_reading_end_of_stream_between_and_inside_frames() -> None:
    decoder = FrameDecoder()
    read_into(decoder, encode(body=b"x"))
    decoder.feed(b"")
    assert [bytes(f.body) for f in drain(decoder)] == [b"x"]
    assert decoder.next_frame() is Event.CLOSED
    with pytest.raises(RuntimeError):
        decoder.get_buffer(-1)
    decoder = FrameDecoder()
    read_into(decoder, encode(body=b"abcdef")[:-2])
    assert decoder.next_frame() is Event.NEED_DATA and decoder.buffered_bytes > 0
    decoder.feed(b"")
    with pytest.raises(MalformedFrameError, match="ended inside a frame") as info:
        decoder.next_frame()
    assert info.value.must_close


def test_reading_an_oversized_frame_is_refused_from_its_prefix_alone() -> None:
    decoder = FrameDecoder(frame_size_max_bytes=1024)
    read_into(decoder, PREFIX.pack(10**9, 10))
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()
    assert len(decoder.get_buffer(-1)) < 10**6  # nothing was allocated for it


def test_reading_reports_a_pending_header() -> None:
    decoder = FrameDecoder()
    data = encode(fields={"k": "v" * 100}, body=b"b" * 100)
    read_into(decoder, data[:3])
    assert decoder.next_frame() is Event.NEED_DATA and decoder.header_pending
    read_into(decoder, data[3:20])
    assert decoder.next_frame() is Event.NEED_DATA and decoder.header_pending
    read_into(decoder, data[20:-5])
    assert decoder.next_frame() is Event.NEED_DATA and not decoder.header_pending
    read_into(decoder, data[-5:])
    assert len(drain(decoder)) == 1 and not decoder.header_pending


def test_a_decoder_is_either_fed_or_read_into() -> None:
    fed = FrameDecoder()
    fed.feed(encode()[:5])
    with pytest.raises(RuntimeError):
        fed.get_buffer(-1)
    read = FrameDecoder()
    read_into(read, encode()[:5])
    with pytest.raises(RuntimeError):
        read.feed(b"more")


def test_reading_again_before_taking_the_frames_keeps_them() -> None:
    decoder = FrameDecoder()
    big = encode(request_id=0, body=b"x" * 400_000)
    read_into(decoder, big[:100])
    assert decoder.next_frame() is Event.NEED_DATA  # its size is known now: a buffer of its own
    smalls = b"".join(encode(request_id=i, body=bytes([i]) * 3000) for i in range(1, 200))
    read_into(decoder, big[100:] + smalls)  # the big buffer fills up with frames no one took yet
    frames = drain(decoder)
    assert [f.request_id for f in frames] == list(range(200))
    assert bytes(frames[0].body) == b"x" * 400_000
    assert all(bytes(f.body) == bytes([f.request_id]) * 3000 for f in frames[1:])
