"""``host:port`` addresses: the one parser every component uses, and the advertised form."""

from __future__ import annotations

import socket

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def split_address(address: str, what: str = "address", *, port_zero_ok: bool = False) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` → ``(host, port)``; ``ValueError`` names ``what`` is wrong.

    ``port_zero_ok`` admits port 0 (a listen address asking for a free port)."""
    host, sep, port = address.strip().rpartition(":")
    lowest = 0 if port_zero_ok else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) <= 65535:
        raise ValueError(f"{what} {address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def peer_address(peername: object) -> str:
    """A socket's ``getpeername()`` for log and audit lines: ``host:port`` (``[v6]:port``) for an
    IP socket's tuple, anything else as it is."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        return join_address(str(peername[0]), int(peername[1]))
    return str(peername)


def advertised_address(listen_host: str, port: int) -> str:
    """The address to publish for a server listening on ``listen_host``: for a wildcard, this
    host's primary address (loopback when it has none)."""
    host = listen_host
    if host in WILDCARD_HOSTS:
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    return join_address(host, port)
