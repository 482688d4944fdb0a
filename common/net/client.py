"""The client side of a gms connection: pipelined requests matched to responses by id.

One :class:`Connection` is one TCP connection and one ``asyncio.BufferedProtocol``: callers write
frames directly, the protocol's reader resolves the future pending under each response's
id (responses may come in any order), and closing fails every pending request with a
retriable :class:`ConnectionClosedError` that names the cause.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Mapping
from typing import Any, cast

from gms.errors import (
    ConnectionClosedError,
    ProtocolError,
    RequestTimeoutError,
    ServiceUnavailableError,
    error_for_status,
)
from gms.net.server import CONNECTION_ERROR_ID
from gms.net.writes import write_parts
from gms.protocol.codes import Flag, RequestCode
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import FRAME_SIZE_MAX_BYTES, Body, Frame, encode_frame
from gms.security.client import PLAINTEXT, ClientSecurity

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS = 3000
REQUEST_TIMEOUT_MS = 30_000
REQUEST_ID_LIMIT = 2**32  # ids wrap here; far more than can be pending at once
CLOCK_SLACK_S = 0.001  # a deadline this close counts as passed (uvloop's clock counts whole ms)


def tls_hint(err: BaseException) -> str:
    """What to check when a TLS handshake failed (nothing for other failures)."""
    if isinstance(err, ssl.SSLCertVerificationError):
        return " (its TLS certificate is not trusted: give the CA that issued it, GMS_TLS_CA / --tls-ca)"
    if isinstance(err, ssl.SSLError):
        return " (TLS handshake failed: does the server speak TLS, and do both sides trust each other?)"
    return ""


class Connection(asyncio.BufferedProtocol):
    """A client connection to a gms server. Create with :meth:`open`.

    The transport reads straight into the frame decoder's buffer (``get_buffer``), so a large
    response (a PULL of a megabyte) lands where its frame is decoded, never copied on the way."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        request_timeout_ms: float | None = REQUEST_TIMEOUT_MS,
        frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES,
    ) -> None:
        self.address = address
        self._request_timeout_ms = request_timeout_ms
        self._frame_size_max_bytes = frame_size_max_bytes
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(frame_size_max_bytes=frame_size_max_bytes)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        # The requests pending with the connection's own timeout: their deadlines, oldest first
        # (one timeout, so in deadline order), expired by one timer at the oldest one's (a timer
        # per request cost ~2 us of the loop's time to make and cancel).
        self._deadlines: dict[int, float] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._last_id = CONNECTION_ERROR_ID
        self._drain_waiter: asyncio.Future[None] | None = None
        self._close_cause: BaseException | None = None
        self._closed = self._loop.create_future()
        # The transport asks for room before each read: the decoder's own, without a call through here.
        self.get_buffer = self._decoder.get_buffer  # type: ignore[method-assign]

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        timeout_ms: float = CONNECT_TIMEOUT_MS,
        *,
        request_timeout_ms: float | None = REQUEST_TIMEOUT_MS,
        frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES,
        security: ClientSecurity = PLAINTEXT,
    ) -> Connection:
        """Connect to ``host:port`` (TLS and authentication as ``security`` says); raise
        :class:`ServiceUnavailableError` if that fails, :class:`UnauthenticatedError` if the
        credentials are refused."""
        loop = asyncio.get_running_loop()
        conn = cls(
            (host, port),
            request_timeout_ms=request_timeout_ms,
            frame_size_max_bytes=frame_size_max_bytes,
        )
        context = security.ssl_context
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await loop.create_connection(lambda: conn, host, port, ssl=context,
                                             server_hostname=host if context is not None else None)
        except (OSError, TimeoutError) as err:
            raise ServiceUnavailableError(f"cannot connect to {host}:{port}{tls_hint(err)}: {err!r}") from err
        exchange = security.exchange()
        if exchange is not None:
            try:
                first = await conn.request(RequestCode.AUTHENTICATE, None, exchange.first(), timeout_ms=timeout_ms)
                final = await conn.request(RequestCode.AUTHENTICATE, None, exchange.final(bytes(first.body)),
                                           timeout_ms=timeout_ms)
                exchange.verify(bytes(final.body))
            except BaseException:
                await conn.close_and_wait(timeout_ms)
                raise
        return conn

    @property
    def closed(self) -> bool:
        return self._close_cause is not None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # --- requests ---------------------------------------------------------------------------

    async def request(
        self,
        code: int,
        fields: Mapping[str, Any] | None = None,
        body: Body = b"",
        *,
        timeout_ms: float | None = None,
    ) -> Frame:
        """Send a request and return the response frame; non-success statuses raise.

        ``timeout_ms`` defaults to the connection's ``request_timeout_ms``; on expiry the
        request is abandoned (it may still take effect) and :class:`RequestTimeoutError`
        is raised.
        """
        if self._close_cause is not None or self._drain_waiter is not None:  # (no coroutine when writable)
            await self._wait_writable()
        request_id = self._next_id()
        parts = encode_frame(
            code, request_id, fields=fields, body=body,
            frame_size_max_bytes=self._frame_size_max_bytes,
        )
        future = self._loop.create_future()
        self._pending[request_id] = future
        write_parts(self._transport, parts)  # type: ignore[arg-type]
        timer = None
        if timeout_ms is not None:
            timer = self._loop.call_later(timeout_ms / 1000, self._expire, request_id, timeout_ms)
        elif self._request_timeout_ms is not None:
            deadline = self._loop.time() + self._request_timeout_ms / 1000
            self._deadlines[request_id] = deadline
            if self._sweeper is None:
                self._sweeper = self._loop.call_at(deadline, self._sweep)
        try:
            response = await future
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(request_id, None)
            self._deadlines.pop(request_id, None)
        if response.status:
            raise error_for_status(response.status, response.error, response.fields)
        return response

    async def oneway(
        self, code: int, fields: Mapping[str, Any] | None = None, body: Body = b""
    ) -> None:
        """Send a request that gets no response; returns once written (or buffered)."""
        await self._wait_writable()
        parts = encode_frame(
            code, self._next_id(), flags=Flag.ONEWAY, fields=fields, body=body,
            frame_size_max_bytes=self._frame_size_max_bytes,
        )
        write_parts(self._transport, parts)  # type: ignore[arg-type]

    def _next_id(self) -> int:
        request_id = self._last_id % (REQUEST_ID_LIMIT - 1) + 1  # 1 .. LIMIT-1, never 0
        self._last_id = request_id
        return request_id

    async def _wait_writable(self) -> None:
        """Raise if closed; wait while the server is not reading what we send."""
        while True:
            if self._close_cause is not None:
                raise self._closed_error()
            if self._drain_waiter is None:
                return
            await asyncio.shield(self._drain_waiter)

    def _sweep(self) -> None:
        """Expire the requests of the connection's own timeout whose deadline passed, then wait
        for the next one's."""
        self._sweeper = None
        now = self._loop.time() + CLOCK_SLACK_S
        due = []
        for request_id, deadline in self._deadlines.items():
            if deadline > now:
                break
            due.append(request_id)
        for request_id in due:
            del self._deadlines[request_id]
            self._expire(request_id, cast(float, self._request_timeout_ms))
        if self._deadlines:
            self._sweeper = self._loop.call_at(next(iter(self._deadlines.values())), self._sweep)

    def _expire(self, request_id: int, timeout_ms: float) -> None:
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(
                RequestTimeoutError(f"no response from {self._peer()} within {timeout_ms} ms")
            )

    # --- closing ----------------------------------------------------------------------------

    def close(self, cause: BaseException | None = None) -> None:
        """Close the connection; every pending request fails with ConnectionClosedError."""
        if self._close_cause is None:
            self._close_cause = cause or ConnectionClosedError("connection closed by the client")
        if self._transport is not None:
            self._transport.close()
        self._fail_pending()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    async def close_and_wait(self, timeout_ms: float) -> None:
        """Close and wait (at most ``timeout_ms``, even if cancelled meanwhile) until the transport
        is gone: a TLS close exchanges close_notify first, and a loop stopped before that ends
        cannot close (uvloop: EBUSY) and leaks the transport."""
        self.close()
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await self.wait_closed()
        except TimeoutError:
            self._abort()
        except asyncio.CancelledError:
            self._abort()
            raise

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _closed_error(self) -> ConnectionClosedError:
        cause = self._close_cause
        if isinstance(cause, ConnectionClosedError):
            err = ConnectionClosedError(str(cause))
        else:
            err = ConnectionClosedError(f"connection to {self._peer()} closed: {cause!r}")
        err.__cause__ = cause
        return err

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for future in pending.values():
            if not future.done():
                future.set_exception(self._closed_error())
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)  # writers wake up and see the close

    def _peer(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # --- asyncio.BufferedProtocol callbacks -------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport = self._transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._decoder.buffer_updated(nbytes)
        self._read_frames()

    def eof_received(self) -> bool:
        self._decoder.feed(b"")
        self._read_frames()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._close_cause is None:
            self._close_cause = exc or ConnectionClosedError(
                f"connection closed by the server {self._peer()}"
            )
        self._fail_pending()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        if self._drain_waiter is None:
            self._drain_waiter = self._loop.create_future()

    def resume_writing(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _read_frames(self) -> None:
        pending = self._pending
        while True:
            try:
                frame = self._decoder.next_frame()
            except ProtocolError as err:
                if err.must_close:
                    self.close(err)
                    return
                log.warning("dropped a malformed frame from %s: %s", self._peer(), err)
                continue
            if type(frame) is not Frame:
                if frame is Event.CLOSED:
                    self.close(ConnectionClosedError(f"connection closed by {self._peer()}"))
                return
            future = pending.pop(frame.request_id, None)
            if future is not None:
                if not future.done():
                    future.set_result(frame)
            elif frame.request_id == CONNECTION_ERROR_ID and frame.status:
                # The server explains why it is about to close the connection.
                self._close_cause = error_for_status(frame.status, frame.error, frame.fields)
            else:
                log.debug("response %d from %s matches no pending request", frame.request_id,
                          self._peer())
