"""The Kafka API's wire handling against a real broker: ApiVersions advertises what is served, and
requests it cannot serve (a bad frame length, an unknown API key or version, a truncated batch, a
batch whose CRC fails) get an error or a closed connection while the broker keeps serving."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from gms.broker.kafka.apis import SUPPORTED, ApiKey, Header, request_schema, response_schema, write_response
from gms.broker.kafka.errors import Err
from gms.broker.kafka.records import KafkaRecord, decode_batch, encode_batch, split_batches
from gms.broker.kafka.wire import BY_REFERENCE_MIN, Reader, Writer
from tests.processes import wait_until

TIMEOUT_S = 10


def connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=TIMEOUT_S)


def frame(key: int, version: int, body: bytes, correlation_id: int = 7, flexible: bool = False) -> bytes:
    header = struct.pack(">hhih", key, version, correlation_id, 4) + b"test" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(header) + len(body)) + header + body


def encode(key: ApiKey, version: int, body: dict) -> bytes:
    schema = request_schema(key)
    writer = Writer()
    schema.write(writer, body, version)
    return frame(key, version, bytes(writer.buf), flexible=schema.is_flexible(version))


def read_frame(sock: socket.socket) -> bytes | None:
    """A response frame's bytes after its size (None: the broker closed the connection)."""
    size = _read(sock, 4)
    return None if len(size) < 4 else _read(sock, struct.unpack(">i", size)[0])


def _read(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or fewer if the connection closes first (a socket with a timeout reads what
    has come, MSG_WAITALL or not)."""
    got = bytearray()
    while len(got) < n and (chunk := sock.recv(n - len(got))):
        got += chunk
    return bytes(got)


def call(sock: socket.socket, key: ApiKey, version: int, body: dict) -> dict:
    sock.sendall(encode(key, version, body))
    raw = read_frame(sock)
    assert raw is not None, "the broker closed the connection"
    reader = Reader(raw)
    assert reader.int32() == 7
    schema = response_schema(key)
    if key is not ApiKey.API_VERSIONS and schema.is_flexible(version):
        reader.tagged()
    return schema.read(reader, version)


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("version", [0, 3])
def test_api_versions_advertises_exactly_what_is_served(bootstrap, version):
    with connect(bootstrap) as sock:
        body = {"client_software_name": "t", "client_software_version": "1"}
        answer = call(sock, ApiKey.API_VERSIONS, version, body)
    assert answer["error_code"] == 0
    assert {row["api_key"]: (row["min_version"], row["max_version"]) for row in answer["api_keys"]} == {
        int(key): versions for key, versions in SUPPORTED.items()}


def test_an_api_versions_too_new_answers_unsupported_version_at_version_0(bootstrap):
    with connect(bootstrap) as sock:
        sock.sendall(frame(ApiKey.API_VERSIONS, 99, b"\x00\x00\x00", flexible=True))
        reader = Reader(read_frame(sock))
        assert reader.int32() == 7
        answer = response_schema(ApiKey.API_VERSIONS).read(reader, 0)
    assert answer["error_code"] == Err.UNSUPPORTED_VERSION
    assert {row["api_key"] for row in answer["api_keys"]} == {int(key) for key in SUPPORTED}


@pytest.mark.parametrize("raw", [
    struct.pack(">i", -5),  # a negative frame length
    struct.pack(">i", 200 << 20),  # over the 100 MiB a request may have
    frame(ApiKey.FETCH, 99, b""),  # a version not served
    frame(57, 0, b""),  # an API key not served (UpdateFeatures)
    frame(ApiKey.METADATA, 1, b"\x00\x00\x00\x05\x00"),  # an array of 5 topics in one byte
], ids=["negative-length", "too-large", "unknown-version", "unknown-key", "truncated-body"])
def test_a_request_the_broker_cannot_serve_closes_the_connection_and_it_serves_on(bootstrap, raw):
    with connect(bootstrap) as sock:
        sock.sendall(raw)
        assert closed(sock)
    with connect(bootstrap) as sock:
        assert call(sock, ApiKey.API_VERSIONS, 3, {})["error_code"] == 0


def _null_metadata_join() -> bytes:
    """A JoinGroup v5 whose protocol metadata (bytes, not nullable) is sent as null."""
    def string(text: bytes) -> bytes:
        return struct.pack(">h", len(text)) + text
    body = (string(b"g") + struct.pack(">ii", 10000, 10000) + string(b"") + struct.pack(">h", -1)
            + string(b"consumer") + struct.pack(">i", 1) + string(b"range") + struct.pack(">i", -1))
    return frame(ApiKey.JOIN_GROUP, 5, body)


def test_a_null_the_schema_does_not_allow_is_a_malformed_request_not_a_broker_failure(standalone, bootstrap):
    broker_log = Path(standalone["data_dir"]) / "logs" / "broker.log"
    with connect(bootstrap) as sock:
        sock.sendall(_null_metadata_join())
        assert closed(sock)
    with connect(bootstrap) as sock:
        assert call(sock, ApiKey.API_VERSIONS, 3, {})["error_code"] == 0
    log = broker_log.read_text(errors="replace")
    assert "malformed JOIN_GROUP v5 (metadata is null)" in log
    assert "Traceback" not in log


def _served(bootstrap: str) -> bool:
    try:
        with connect(bootstrap) as sock:
            sock.sendall(encode(ApiKey.API_VERSIONS, 3, {}))
            return read_frame(sock) is not None
    except ConnectionError:
        return False


def _produce(sock: socket.socket, topic: str, records: bytes) -> dict:
    answer = call(sock, ApiKey.PRODUCE, 9, {"acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    return answer["responses"][0]["partition_responses"][0]


def _batch() -> bytearray:
    now = int(time.time() * 1000)
    return bytearray(encode_batch(0, [KafkaRecord(i, now, b"k", b"v%d" % i, []) for i in range(3)]))


def test_a_batch_whose_crc_fails_or_that_is_cut_short_is_refused_and_nothing_is_stored(bootstrap, topic):
    bad_crc = _batch()
    bad_crc[-1] ^= 0xFF
    truncated = _batch()[:-4]
    short_header = _batch()[:40]
    with connect(bootstrap) as sock:
        for records in (bad_crc, truncated, short_header):
            assert _produce(sock, topic, bytes(records))["error_code"] == Err.CORRUPT_MESSAGE
        stored = _produce(sock, topic, bytes(_batch()))
        assert (stored["error_code"], stored["base_offset"]) == (0, 0)  # nothing stored before it


def test_a_batch_for_a_partition_the_topic_lacks_is_refused(bootstrap, topic):
    with connect(bootstrap) as sock:
        answer = call(sock, ApiKey.PRODUCE, 9, {"acks": 1, "timeout_ms": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 9, "records": bytes(_batch())}]},
            {"name": "no-such-topic", "partition_data": [{"index": 0, "records": bytes(_batch())}]}]})
    codes = [r["partition_responses"][0]["error_code"] for r in answer["responses"]]
    assert all(code != 0 for code in codes), codes
    assert codes[1] == Err.UNKNOWN_TOPIC_OR_PARTITION


def test_an_acks_0_produce_that_fails_closes_the_connection(bootstrap, topic):
    with connect(bootstrap) as sock:
        request = {"acks": 0, "timeout_ms": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": bytes(_batch())}]}]}
        sock.sendall(encode(ApiKey.PRODUCE, 9, request))  # stored: no answer, the connection stays
        assert call(sock, ApiKey.API_VERSIONS, 3, {})["error_code"] == 0
        request["topic_data"][0]["name"] = "no-such-topic"
        sock.sendall(encode(ApiKey.PRODUCE, 9, request))
        assert closed(sock)


def test_a_fetch_answer_whose_records_are_written_by_reference_is_one_whole_frame(bootstrap, topic):
    """A fetch's record batch of more than BY_REFERENCE_MIN bytes goes out as its own buffer, the
    frame's length counting it: the records come back whole, and the connection's next answer
    is framed where this one ends."""
    now = int(time.time() * 1000)
    values = [b"%06d" % i + b"v" * 994 for i in range(300)]  # 300 kB: several times BY_REFERENCE_MIN
    batch = encode_batch(0, [KafkaRecord(i, now, None, value, []) for i, value in enumerate(values)])
    assert len(batch) > 4 * BY_REFERENCE_MIN
    with connect(bootstrap) as sock:
        assert _produce(sock, topic, batch)["error_code"] == 0
        for _ in range(2):
            row = _fetch(sock, topic, 0, 1 << 20)
            assert (row["error_code"], row["high_watermark"]) == (0, len(values))
            assert _values(row) == values


def _fetch(sock: socket.socket, topic: str, offset: int, partition_max_bytes: int, max_bytes: int = 50 << 20) -> dict:
    """Partition 0's row of a Fetch v12 from ``offset``."""
    answer = call(sock, ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}]}]})
    return answer["responses"][0]["partitions"][0]


def _values(row: dict) -> list[bytes]:
    return [bytes(r.value) for raw in split_batches(memoryview(row["records"])) for r in decode_batch(raw).records]


def test_a_fetch_answers_a_partition_up_to_its_max_bytes_but_a_first_record_larger_whole(bootstrap, topic):
    """As Kafka (KIP-74): a partition's records up to partition_max_bytes, and a first record
    larger than that (or than max_bytes) alone rather than nothing, so the consumer moves on."""
    now = int(time.time() * 1000)
    values = [b"%04d" % i + b"x" * 996 for i in range(20)] + [b"big" * 2000] + [b"after"]
    with connect(bootstrap) as sock:
        assert _produce(sock, topic, encode_batch(0, [KafkaRecord(i, now, None, value, [])
                                                      for i, value in enumerate(values)]))["error_code"] == 0
        some = _values(_fetch(sock, topic, 0, 5000))
        assert 1 <= len(some) < 20 and some == values[:len(some)]
        assert _values(_fetch(sock, topic, 20, 1000)) == [values[20]]
        assert _values(_fetch(sock, topic, 20, 1 << 20, max_bytes=1000)) == [values[20]]


def test_a_frame_writer_writes_what_a_writer_writes():
    """A frame written in parts (large byte fields by reference) is byte for byte the one a
    plain Writer writes in one buffer."""
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "t", "partitions": [
        {"partition_index": p, "error_code": 0, "high_watermark": 9, "last_stable_offset": 9, "log_start_offset": 0,
         "aborted_transactions": [], "preferred_read_replica": -1, "records": bytes([p]) * size}
        for p, size in enumerate((0, 10, BY_REFERENCE_MIN, 3 * BY_REFERENCE_MIN + 1))]}]}
    header = Header(ApiKey.FETCH, 12, 7, "test")
    plain = Writer()
    plain.int32(7)
    plain.uvarint(0)
    response_schema(ApiKey.FETCH).write(plain, body, 12)
    parts = write_response(header, body)
    assert len(parts) == 5  # the two large batches by reference, each between the bytes around it
    assert b"".join(parts) == struct.pack(">i", len(plain.buf)) + plain.buf


def test_clients_beyond_the_connection_maximum_are_closed_and_the_others_served(broker_factory, tmp_path):
    config, port_file = tmp_path / "limits.toml", tmp_path / "kafka.port"
    config.write_text("[broker]\nconnections_max = 2\n")
    broker_factory("--config", str(config), "--kafka-listen", "127.0.0.1:0", "--kafka-port-file", str(port_file))
    bootstrap = f"127.0.0.1:{int(port_file.read_text())}"
    first, second = connect(bootstrap), connect(bootstrap)
    try:
        for sock in (first, second):
            assert call(sock, ApiKey.API_VERSIONS, 3, {})["error_code"] == 0
        with connect(bootstrap) as third:
            assert closed(third)
        first.close()
        wait_until(lambda: _served(bootstrap), TIMEOUT_S)  # once the broker has seen the close
    finally:
        first.close()
        second.close()
