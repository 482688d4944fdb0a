"""Writing a frame's buffers to a transport with the GIL released.

uvloop writes to the socket holding the GIL, and Python 3.11's own transports join the buffers
into one bytes first: a SEND_BATCH of a megabyte of sealed batches (or a FETCH answer of the
commitlog's pages) held the GIL for the whole copy into the kernel, ~0.3 ms, while the producer's
appending thread waited. :func:`write_parts` hands large frames to ``os.writev`` on the socket
itself while the transport has nothing buffered (so the order holds), and buffers only what the
socket did not take.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from gms.protocol.frame import Buffer

DIRECT_WRITE_BYTES_MIN = 64 * 1024  # smaller frames: the transport's write is cheaper
# buffers one writev takes (0 where there is no writev: every frame goes through the transport)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "writev") and hasattr(os, "sysconf") else 0


def write_parts(transport: asyncio.WriteTransport, parts: Sequence[Buffer]) -> None:
    """``transport.writelines(parts)``, a large frame written directly (GIL released)."""
    large = len(parts) <= _IOV_MAX and sum(map(len, parts)) >= DIRECT_WRITE_BYTES_MIN  # (byte buffers)
    fd = _plain_socket_fd(transport) if large else -1
    if fd < 0 or transport.is_closing() or transport.get_write_buffer_size():
        transport.writelines(parts)
        return
    try:
        sent = os.writev(fd, parts)
    except OSError:  # full, interrupted, or failed: the transport's own write takes it (and reports an error)
        sent = 0
    rest = unsent(parts, sent)
    if rest:
        transport.writelines(rest)


def _plain_socket_fd(transport: asyncio.BaseTransport) -> int:
    """The descriptor of a plain (not TLS) socket transport's socket, or -1."""
    if transport.get_extra_info("sslcontext") is not None or transport.get_extra_info("ssl_object") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    return -1 if sock is None else int(sock.fileno())


def unsent(parts: Sequence[Buffer], sent: int) -> list[Buffer]:
    """What is left of ``parts`` once their first ``sent`` bytes went out (views, no copies)."""
    for k, part in enumerate(parts):
        view = memoryview(part).cast("B")
        if sent < view.nbytes:
            return [view[sent:], *parts[k + 1:]]
        sent -= view.nbytes
    return []
