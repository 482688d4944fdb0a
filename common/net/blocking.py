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
import ssl
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from gms.errors import (
    ConnectionClosedError,
    GmsError,
    ProtocolError,
    RequestTimeoutError,
    ServiceUnavailableError,
    error_for_status,
)
from gms.net.busy_poll import CLIENT_WINDOW_US, recv_polling
from gms.net.client import CONNECT_TIMEOUT_MS, REQUEST_ID_LIMIT, tls_hint
from gms.net.server import CONNECTION_ERROR_ID
from gms.protocol.codes import RequestCode
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import FRAME_SIZE_MAX_BYTES, Body, Buffer, Frame, encode_frame
from gms.security.client import PLAINTEXT, ClientSecurity

# One read: a send acknowledgement is a few hundred bytes, a batch's a few KiB per 1,000. Reads go
# into one buffer kept per connection and only what arrived is copied out: a fresh bytes of 128 KiB or more
# per recv() costs an mmap, an mremap and a munmap (glibc maps blocks that large).
_RECV_SIZE_BYTES = 64 * 1024
# Buffers one sendmsg takes; POSIX guarantees IOV_MAX >= 16. More are joined first.
_SEND_BUFFERS_MAX = 16
# SO_RCVTIMEO / SO_SNDTIMEO take a struct timeval; 0 would mean "no timeout".
_TIMEVAL = struct.Struct("@ll")
_TIMEOUT_US_MIN = 1


# A kernel timeout fails with EAGAIN (under TLS: the SSL layer's "want read/write").
_TIMEOUT_ERRORS = (TimeoutError, BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class _Abandoned(Exception):
    """Carries the error an ``abandon`` check gave past the timeout handling."""

    def __init__(self, error: GmsError) -> None:
        super().__init__(error)
        self.error = error


def _nbytes(part: Buffer) -> int:
    return part.nbytes if type(part) is memoryview else len(part)


def _timeval(timeout_s: float) -> bytes:
    timeout_us = max(round(timeout_s * 1e6), _TIMEOUT_US_MIN)
    return _TIMEVAL.pack(*divmod(timeout_us, 1_000_000))


class BlockingConnection:
    """A TCP connection to a gms server used by one thread at a time. Create with :meth:`open`.

    The socket is in blocking mode with kernel timeouts (SO_RCVTIMEO, SO_SNDTIMEO): a Python
    socket timeout would add a poll() before every send and every receive."""

    def __init__(self, sock: socket.socket, address: tuple[str, int], *,
                 frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES, busy_poll_us: int = CLIENT_WINDOW_US) -> None:
        """``busy_poll_us``: how long a request polls for its response before it sleeps
        (:mod:`gms.net.busy_poll`; 0: off, and always off under TLS)."""
        if busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be >= 0, not {busy_poll_us}")
        self.address = address
        self._sock = sock
        sock.settimeout(None)
        self._frame_size_max_bytes = frame_size_max_bytes
        self._decoder = FrameDecoder(frame_size_max_bytes=frame_size_max_bytes)
        self._last_id = CONNECTION_ERROR_ID
        self._timeout_s: float | None = None  # the kernel timeouts set on the socket
        self._recv_buffer = bytearray(_RECV_SIZE_BYTES)
        self._recv_view = memoryview(self._recv_buffer)
        self._tls = isinstance(sock, ssl.SSLSocket)  # no sendmsg() on a TLS socket
        self._busy_poll_us = 0 if self._tls else busy_poll_us
        self.closed = False

    @classmethod
    def open(cls, host: str, port: int, timeout_ms: float = CONNECT_TIMEOUT_MS, *,
             security: ClientSecurity = PLAINTEXT, busy_poll_us: int = CLIENT_WINDOW_US) -> BlockingConnection:
        """Connect to ``host:port`` (TLS and authentication as ``security`` says); raise
        :class:`ServiceUnavailableError` if that fails, :class:`UnauthenticatedError` if the
        credentials are refused."""
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((host, port), timeout=timeout_ms / 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = security.ssl_context
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
        except OSError as err:
            if sock is not None:
                sock.close()
            raise ServiceUnavailableError(f"cannot connect to {host}:{port}{tls_hint(err)}: {err!r}") from err
        conn = cls(sock, (host, port), busy_poll_us=busy_poll_us)
        exchange = security.exchange()
        if exchange is not None:
            try:
                first = conn.request(RequestCode.AUTHENTICATE, None, exchange.first(), timeout_ms=timeout_ms)
                final = conn.request(RequestCode.AUTHENTICATE, None, exchange.final(bytes(first.body)),
                                     timeout_ms=timeout_ms)
                exchange.verify(bytes(final.body))
            except BaseException:
                conn.close()
                raise
        return conn

    def _set_timeout(self, timeout_s: float) -> None:
        if timeout_s != self._timeout_s:  # two setsockopt calls: only when it changes
            timeval = _timeval(timeout_s)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            self._timeout_s = timeout_s

    def request(self, code: int, fields: Mapping[str, Any] | None = None, body: Body = b"", *,
                timeout_ms: float, abandon: Callable[[], GmsError | None] | None = None,
                check_interval_ms: float = 0) -> Frame:
        """Send a request and wait for its response; non-success statuses raise.

        ``abandon`` is asked every ``check_interval_ms`` while no response came: an error it
        returns is raised at once (the request is given up; it may still take effect), None waits
        on. Any failure but an error status closes the connection: a late response would
        otherwise be read as the answer to the next request."""
        if self.closed:
            raise ConnectionClosedError(f"connection to {self._peer()} closed")
        self._last_id = request_id = self._last_id % (REQUEST_ID_LIMIT - 1) + 1
        parts = encode_frame(code, request_id, fields=fields, body=body,
                             frame_size_max_bytes=self._frame_size_max_bytes)
        timeout_s = timeout_ms / 1000
        wait_s = timeout_s if abandon is None else min(timeout_s, check_interval_ms / 1000)
        try:
            self._set_timeout(wait_s)
            deadline = time.monotonic() + timeout_s
            if len(parts) > _SEND_BUFFERS_MAX or self._tls:
                parts = [b"".join(parts)]
            sent = self._sock.sendmsg(parts) if not self._tls else self._sock.send(parts[0])
            if sent < sum(map(_nbytes, parts)):  # socket buffer full: the rest may take the whole timeout
                self._set_timeout(timeout_s)
                self._sock.sendall(memoryview(b"".join(parts))[sent:])
                self._set_timeout(wait_s)
            response = self._read_response(request_id, deadline, wait_s, abandon)
        except _Abandoned as abandoned:
            self.close()
            raise abandoned.error from None
        except _TIMEOUT_ERRORS as err:
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

    def _read_response(self, request_id: int, deadline: float, wait_s: float,
                       abandon: Callable[[], GmsError | None] | None) -> Frame:
        """The response to ``request_id``, each receive waiting at most ``wait_s`` (the socket's
        timeout as set), then asking ``abandon``; the whole response keeps to ``deadline``."""
        decoder = self._decoder
        first = True
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
            if not first:  # a response in pieces, or a wait checked: the whole request keeps to its timeout
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise TimeoutError("the response did not arrive in time")
                self._set_timeout(min(remaining_s, wait_s))
            received = None
            if first and self._busy_poll_us:  # polled once per request: its first bytes
                received = recv_polling(self._sock, self._recv_buffer, self._busy_poll_us)
            first = False
            if received is None:
                try:
                    received = self._sock.recv_into(self._recv_buffer)
                except _TIMEOUT_ERRORS:
                    if abandon is None or time.monotonic() >= deadline:
                        raise
                    error = abandon()
                    if error is not None:
                        raise _Abandoned(error) from None
                    continue
            decoder.feed(bytes(self._recv_view[:received]))  # b"" (end of stream) when nothing came

    def close(self) -> None:
        self.closed = True
        self._sock.close()

    def _peer(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"
