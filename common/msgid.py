"""Message ids that locate a message, as RocketMQ's offset message ids do.

An id is the hex of ``broker IP (4 or 16 bytes) | broker port (u32) | commitlog
offset (i64)``: whoever holds it can ask that broker for the record at that
physical offset without any index.  IPv4 ids are 32 hex characters, IPv6 ids 48.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import NamedTuple

_PORT_OFFSET = struct.Struct(">Iq")


class MessageId(NamedTuple):
    host: str
    port: int
    phys_offset: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _host_bytes(host: str) -> bytes:
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        # A hostname: ids must be self-contained, so store the address it resolves to.
        return ipaddress.ip_address(socket.gethostbyname(host)).packed


def encode_msg_id(host: str, port: int, phys_offset: int) -> str:
    """The id of the record at ``phys_offset`` on the broker at ``host:port``."""
    return (_host_bytes(host) + _PORT_OFFSET.pack(port, phys_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> MessageId:
    """Parse an id made by :func:`encode_msg_id`; ``ValueError`` says what is wrong."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as err:
        raise ValueError(f"message id {msg_id!r} is not hexadecimal") from err
    ip_len = len(raw) - _PORT_OFFSET.size
    if ip_len not in (4, 16):
        raise ValueError(
            f"message id {msg_id!r} has {len(raw)} bytes; expected 16 (IPv4) or 28 (IPv6)"
        )
    port, phys_offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    if phys_offset < 0 or port > 65535:
        raise ValueError(f"message id {msg_id!r} does not encode a valid address and offset")
    return MessageId(str(ipaddress.ip_address(raw[:ip_len])), port, phys_offset)
