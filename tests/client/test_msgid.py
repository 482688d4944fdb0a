import pytest

from gms.msgid import decode_msg_id, encode_msg_id


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "::1", "fe80::1"])
@pytest.mark.parametrize("offset", [0, 1, 2**40 + 7, 2**63 - 1])
def test_round_trip(host, offset):
    decoded = decode_msg_id(encode_msg_id(host, 10911, offset))
    assert decoded.port == 10911 and decoded.phys_offset == offset
    assert decoded.host == host


def test_ipv4_id_is_32_hex_chars():
    msg_id = encode_msg_id("127.0.0.1", 10911, 1234)
    assert len(msg_id) == 32 and decode_msg_id(msg_id.lower()).address == "127.0.0.1:10911"


def test_hostname_resolves():
    assert decode_msg_id(encode_msg_id("localhost", 1, 2)).host == "127.0.0.1"


@pytest.mark.parametrize("bad", ["", "zz", "00" * 15, "00" * 17, "7F000001" + "0001FFFF" + "FF" * 8])
def test_bad_ids_are_rejected_with_a_reason(bad):
    with pytest.raises(ValueError, match="message id"):
        decode_msg_id(bad)
