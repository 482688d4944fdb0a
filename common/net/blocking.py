"""A blocking client connection: one request at a time from the calling thread.

The SDK's connections live on an event loop thread, and a synchronous call hands its work
to that thread and waits for the answer: two thread wake-ups, about 40 µs each on a loaded
two-core machine, as much as a loopback round trip. A :class:`BlockingConnection` lets a
synchronous caller talk to the server itself, so the kernel wakes it straight when the
response arrives. It drives the same sans-IO codec as :class:`gms.net.Connection`; only the
I/O differs. Not thread-safe: a caller borrows it for one request (see
:class:`gms.client.connections.BlockingPool`).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

from gms.errors import (
    ConnectionClosedError,
    ProtocolError,
    RequestTimeoutError,
    ServiceUnavailableError,
    error_for_status,
)
from gms.net.client import CONNECT_TIMEOUT_MS, REQUEST_ID_LIMIT
from gms.net.server import CONNECTION_ERROR_ID
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import FRAME_SIZE_MAX_BYTES, Body, Buffer, Frame, encode_frame

# One read: a send acknowledgement is a few hundred bytes, a batch's a few KiB per 1,000.
_RECV_SIZE_BYTES = 256 * 1024
# Buffers one sendmsg takes; POSIX guarantees IOV_MAX >= 16. More are joined first.
_SEND_BUFFERS_MAX = 16


def _nbytes(part: Buffer) -> int:
    return part.nbytes if type(part) is memoryview else len(part)


class BlockingConnection:
    """A TCP connection to a gms server used by one thread at a time. Create with :meth:`open`."""

    def __init__(self, sock: socket.socket, address: tuple[str, int], *,
                 frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES) -> None:
        self.address = address
        self._sock = sock
        self._frame_size_max_bytes = frame_size_max_bytes
        self._decoder = FrameDecoder(frame_size_max_bytes=frame_size_max_bytes)
        self._last_id = CONNECTION_ERROR_ID
        self._timeout_s = sock.gettimeout()
        self.closed = False

    @classmethod
    def open(cls, host: str, port: int, timeout_ms: float = CONNECT_TIMEOUT_MS) -> BlockingConnection:
        """Connect to ``host:port``; raise :class:`ServiceUnavailableError` if that fails."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout_ms / 1000)
        except OSError as err:
            raise ServiceUnavailableError(f"cannot connect to {host}:{port}: {err!r}") from err
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, (host, port))

    def request(self, code: int, fields: Mapping[str, Any] | None = None, body: Body = b"", *,
                timeout_ms: float) -> Frame:
        """Send a request and wait for its response; non-success statuses raise.

        Any failure but an error status closes the connection: a late response would
        otherwise be read as the answer to the next request."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self._peer()} closed")
        self._last_id = request_id = self._last_id % (REQUEST_ID_LIMIT - 1) + 1
        parts = encode_frame(code, request_id, fields=fields, body=body,
                             frame_size_max_bytes=self._frame_size_max_bytes)
        try:
            timeout_s = timeout_ms / 1000
            if timeout_s != self._timeout_s:  # two fcntl calls each time: only when it changes
                self._sock.settimeout(timeout_s)
                self._timeout_s = timeout_s
            if len(parts) > _SEND_BUFFERS_MAX:
                parts = [b"".join(parts)]
            sent = self._sock.sendmsg(parts)
            if sent < sum(map(_nbytes, parts)):  # socket buffer full
                self._sock.sendall(memoryview(b"".join(parts))[sent:])
            response = self._read_response(request_id)
        except TimeoutError as err:
            self.close()
            raise RequestTimeoutError(f"no response from {self._peer()} within {timeout_ms} ms") from err
        except OSError as err:
            self.close()
            raise ConnectionClosedError(f"connection to {self._peer()} failed: {err!r}") from err
        except BaseException:
            self.close()
            raise
        if response.status:
            raise error_for_status(response.status, response.error, response.fields)
        return response

    def _read_response(self, request_id: int) -> Frame:
        decoder = self._decoder
        while True:
            try:
                frame = decoder.next_frame()
            except ProtocolError as err:
                raise ConnectionClosedError(f"bad response from {self._peer()}: {err}") from err
            if type(frame) is Frame:
                if frame.request_id == request_id:
                    return frame
                if frame.request_id == CONNECTION_ERROR_ID and frame.status:
                    raise error_for_status(frame.status, frame.error, frame.fields)
                raise ConnectionClosedError(
                    f"response {frame.request_id} from {self._peer()} does not answer request {request_id}")
            if frame is Event.CLOSED:
                raise ConnectionClosedError(f"connection closed by {self._peer()}")
            decoder.feed(self._sock.recv(_RECV_SIZE_BYTES))

    def close(self) -> None:
        self.closed = True
        self._sock.close()

    def _peer(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"
