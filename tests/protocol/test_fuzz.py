"""Hypothesis fuzzing: whatever the bytes, the decoder yields frames or raises ProtocolError."""

from __future__ import annotations

import msgpack
from codec_helpers import encode, give
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gms.errors import ProtocolError
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import PREFIX, Frame

SMALL_LIMIT_BYTES = 4096  # small limits so "oversized" is cheap to generate

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text()
    | st.binary(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

valid_frames = st.builds(
    encode,
    code=st.integers(0, 2**16),
    request_id=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 3),
    status=st.integers(0, 100),
    error=st.text(max_size=20),
    fields=st.dictionaries(st.text(max_size=8), msgpack_values, max_size=4),
    body=st.binary(max_size=200),
)


def adversarial_frame(header: object, body: bytes, length_delta: int, header_delta: int) -> bytes:
    header_bytes = msgpack.packb(header)
    frame_length = max(0, min(2**32 - 1, 4 + len(header_bytes) + len(body) + length_delta))
    header_length = max(0, min(2**32 - 1, len(header_bytes) + header_delta))
    return PREFIX.pack(frame_length, header_length) + header_bytes + body


adversarial_frames = st.builds(
    adversarial_frame,
    header=msgpack_values
    | st.fixed_dictionaries(
        {"code": msgpack_values, "id": msgpack_values},
        optional={
            "flags": msgpack_values,
            "status": msgpack_values,
            "error": msgpack_values,
            "fields": msgpack_values,
        },
    ),
    body=st.binary(max_size=64),
    length_delta=st.sampled_from([0, 0, 0, -1, 1, -9, 2**31, 2**32]),
    header_delta=st.sampled_from([0, 0, 0, -1, 1, 2**31, -(2**10)]),
)

streams = st.lists(valid_frames | adversarial_frames | st.binary(max_size=64), max_size=8).map(
    b"".join
)


def decode_everything(data: bytes, cuts: list[int], mode: str = "feed") -> list[Frame]:
    """Give ``data`` split at ``cuts`` (fed, or read into the decoder), then end of stream; only
    frames or ProtocolError."""
    decoder = FrameDecoder(frame_size_max_bytes=SMALL_LIMIT_BYTES, header_size_max_bytes=1024)
    frames: list[Frame] = []
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    for piece in [p for p in pieces if p] + [b""]:
        give(decoder, piece, mode)
        while True:
            try:
                item = decoder.next_frame()
            except ProtocolError as err:
                if err.must_close:
                    return frames
                continue
            if isinstance(item, Event):
                assert item is (Event.CLOSED if piece == b"" else Event.NEED_DATA)
                break
            assert isinstance(item, Frame)
            assert type(item.code) is int and type(item.request_id) is int
            assert item.request_id >= 0 and isinstance(item.error, str)
            frames.append(item)
    return frames


def cut_points(data_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, data_size), max_size=6).map(sorted)


MODES = st.sampled_from(["feed", "read"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), stream=streams, mode=MODES)
def test_any_stream_yields_frames_or_protocol_errors(data: st.DataObject, stream: bytes, mode: str) -> None:
    decode_everything(stream, data.draw(cut_points(len(stream))), mode)


@settings(max_examples=200)
@given(data=st.data(), frames=st.lists(valid_frames, min_size=1, max_size=6), mode=MODES)
def test_valid_frames_survive_any_split(data: st.DataObject, frames: list[bytes], mode: str) -> None:
    stream = b"".join(frames)
    decoded = decode_everything(stream, data.draw(cut_points(len(stream))), mode)
    assert [encode(f.code, f.request_id, flags=f.flags, status=f.status, error=f.error,
                   fields=f.fields, body=bytes(f.body)) for f in decoded] == frames


@settings(max_examples=200)
@given(frame=valid_frames, cut=st.integers(1, 2**16))
def test_truncated_frame_then_end_of_stream_is_fatal(frame: bytes, cut: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(frame[: max(1, len(frame) - cut)])
    decoder.feed(b"")
    try:
        decoder.next_frame()
    except ProtocolError as err:
        assert err.must_close
    else:
        raise AssertionError("a truncated frame must not decode")
