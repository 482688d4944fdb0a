"""The RPC server: frames in, handlers run concurrently, responses out in completion order.

One :class:`_ServerConnection` (an ``asyncio.Protocol``) per client. Its reader decodes
frames with the sans-IO decoder and starts one task per request, so a long-polling pull
does not hold up other requests on the same connection; each response goes out when its
handler finishes, matched by request id. Backpressure: reading pauses while too many
requests (or request bytes) are in flight or while the transport's write buffer is above
its high-water mark, so neither a flood of requests nor a client that does not read its
responses can grow server memory without bound.

Limits across connections (:class:`ServerConfig`): a maximum connection count, a server-wide
budget for bytes held in partly received frames, and idle / slow-header timeouts. A
connection refused by one of them gets an error response under id 0 before it is closed.
Fairness: one connection starts at most ``dispatch_bytes_per_pass_max`` of request bodies per
event-loop pass, so pipelined big batches take turns with other clients' requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, cast

from gms.address import peer_address
from gms.errors import GmsError, ProtocolError, UnauthenticatedError
from gms.log_throttle import RepeatFilter
from gms.net.busy_poll import SERVER_WINDOW_US, LoopBusyPoll
from gms.protocol.codes import Flag, RequestCode, Status
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import (
    EMPTY_FIELDS,
    FRAME_SIZE_MAX_BYTES,
    Body,
    Buffer,
    Frame,
    Response,
    encode_frame,
)
from gms.security.gate import ServerSecurity, audit, current_principal
from gms.security.scram import ScramServerExchange
from gms.security.tls import peer_common_name
from gms.security.users import Principal

log = logging.getLogger(__name__)
# A flood of refused connections is logged once a minute, with a count.
_refusals_log = logging.getLogger(f"{__name__}.refusals")
_refusals_log.addFilter(RepeatFilter())

Handler = Callable[[Frame], Awaitable[Response | None]]
# A handler that answers at once when it can (a plain function, not an ``async def``): called in
# the reader's loop pass, it returns the response (or None), or an awaitable when it must wait
# (then run as a task, like a Handler).
# A request answered at once costs no task and no extra loop pass: about a third of a small
# request's server time. It runs outside any task, so before it returns an awaitable it must not
# use what needs one (asyncio.timeout, current_task).
DirectHandler = Callable[[Frame], "Response | Awaitable[Response | None] | None"]
RequestObserver = Callable[[int, int, float], None]  # (request code, status, seconds): metrics

# A handler's bug, logged with the request it failed (see _request_fields for the arguments).
_HANDLER_FAILED = "handler for request code %(code)d failed (request %(request_id)d from %(peer)s)"

# Responses to errors that no request id can be attached to (garbage before the first
# frame boundary) carry this id; clients never use it for requests.
CONNECTION_ERROR_ID = 0

# Each connection costs a descriptor and, at worst, its in-flight and write-buffer bounds
# (~20 MiB); a few hundred clients are expected, so this leaves ample headroom.
CONNECTIONS_MAX = 4096
# Every connection may be receiving a frame of up to FRAME_SIZE_MAX_BYTES, held whole: without
# a shared budget n such connections pin n x 65 MiB. 256 MiB admits ~4 frames of the largest
# size at once, or over a hundred SDK send requests (SEND_BODY_SIZE_MAX_BYTES each).
UNFINISHED_FRAMES_BYTES_MAX = 256 * 1024 * 1024
# Kafka's connections.max.idle.ms: clients keep pooled connections open between bursts; ten
# minutes of silence with nothing running means the peer is gone or does not need us.
IDLE_TIMEOUT_MS = 10 * 60 * 1000
# A frame's prefix and header (at most 1 MiB) must arrive this soon after its first byte; a
# peer trickling headers (slowloris) otherwise holds a connection and its buffer forever.
HEADER_TIMEOUT_MS = 10_000
# About what a send request of the largest allowed batch costs the broker (~10-30 ms of work):
# one connection's pipelined requests get one such share per loop pass, others then run.
DISPATCH_BYTES_PER_PASS_MAX = 1024 * 1024
# A refused connection is answered, half-closed and drained this long before it is dropped:
# closing a socket with unread input resets it, which can destroy the answer unread.
REFUSED_LINGER_MS = 1000
# The timeout sweep runs at a quarter of the shortest timeout, at most this far apart.
SWEEP_INTERVAL_MAX_MS = 1000


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Connection limits; defaults suit a broker with a few hundred clients."""

    # Requests whose handlers are running; long polls count, so this must exceed the number
    # of concurrent pulls one client makes.
    in_flight_requests_max: int = 1024
    # Request body bytes held by running handlers; one frame larger than this still runs.
    # This is the main per-connection memory bound: an event loop may deliver several
    # read chunks (megabytes) in one iteration, before any response has been written.
    in_flight_bytes_max: int = 16 * 1024 * 1024
    # Reading pauses above high and resumes below low: bounds what a non-reading client costs.
    write_buffer_high_bytes: int = 4 * 1024 * 1024
    write_buffer_low_bytes: int = 1024 * 1024
    frame_size_max_bytes: int = FRAME_SIZE_MAX_BYTES
    # How long stop() lets running handlers finish before cancelling them.
    stop_grace_ms: int = 1000
    # Server-wide limits (see the constants for why these values).
    connections_max: int = CONNECTIONS_MAX
    unfinished_frames_bytes_max: int = UNFINISHED_FRAMES_BYTES_MAX
    idle_timeout_ms: int = IDLE_TIMEOUT_MS
    header_timeout_ms: int = HEADER_TIMEOUT_MS
    dispatch_bytes_per_pass_max: int = DISPATCH_BYTES_PER_PASS_MAX
    # The loop keeps polling this long after each read or write instead of sleeping (see
    # gms.net.busy_poll: ~25 µs less per request round trip on a VM, for that much CPU); 0: off.
    busy_poll_us: int = SERVER_WINDOW_US

    def __post_init__(self) -> None:
        if self.busy_poll_us < 0:
            raise ValueError("busy_poll_us must be >= 0")
        limits = (self.connections_max, self.unfinished_frames_bytes_max, self.idle_timeout_ms,
                  self.header_timeout_ms, self.dispatch_bytes_per_pass_max)
        if min(limits) <= 0:
            raise ValueError("connection limits and timeouts must be positive")


def _ping(request: Frame) -> Response:
    """Built-in PING: echo the body, so clients can check liveness and measure round trips."""
    return Response(body=request.body)


class RpcServer:
    """A TCP server dispatching gms frames to ``{code: async handler(frame) -> Response}``."""

    def __init__(
        self,
        handlers: Mapping[int, Handler | DirectHandler] | None = None,
        *,
        config: ServerConfig | None = None,
        security: ServerSecurity | None = None,
        observe: RequestObserver | None = None,
    ) -> None:
        """``observe(code, status, seconds)`` hears of every answered request (metrics)."""
        self.config = config or ServerConfig()
        self.observe = observe
        self.security = security or ServerSecurity()
        self._handlers: dict[int, Handler] = {}
        self._direct_handlers: dict[int, DirectHandler] = {RequestCode.PING: _ping}
        for code, handler in (handlers or {}).items():
            self.register(code, handler)
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()
        self._sweeper: asyncio.Task[None] | None = None
        # Bytes the connections' decoders hold or expect for partly received frames.
        self.unfinished_frames_bytes = 0

    def register(self, code: int, handler: Handler | DirectHandler) -> None:
        """Add or replace the handler for ``code`` (also while serving): an ``async def`` runs as
        a task; a plain function is a :data:`DirectHandler`."""
        self._handlers.pop(code, None)
        self._direct_handlers.pop(code, None)
        if inspect.iscoroutinefunction(handler):
            self._handlers[code] = handler
        else:
            self._direct_handlers[code] = handler

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port``; port 0 picks a free port (see :attr:`port`)."""
        loop = asyncio.get_running_loop()
        busy_poll = LoopBusyPoll(loop, self.config.busy_poll_us)
        tls = self.security.tls
        tls_timeout_s = self.security.tls_handshake_timeout_ms / 1000 if tls is not None else None
        self._server = await loop.create_server(
            lambda: _ServerConnection(self, busy_poll), host, port, reuse_address=True, ssl=tls,
            ssl_handshake_timeout=tls_timeout_s, ssl_shutdown_timeout=tls_timeout_s,
        )
        self._sweeper = loop.create_task(self._sweep())

    @property
    def port(self) -> int:
        """The bound port (useful after ``start(port=0)``)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def buffered_bytes(self) -> int:
        """Bytes this server holds for its connections: unread input plus unsent output."""
        return sum(conn.buffered_bytes() for conn in self._connections)

    async def stop(self) -> None:
        """Stop accepting, give running handlers the grace period, then close everything."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        connections = list(self._connections)
        for conn in connections:
            conn.stop_reading()
        tasks = [task for conn in connections for task in conn.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.stop_grace_ms / 1000)
        for conn in connections:
            conn.close(abort=True)
        await server.wait_closed()

    async def _sweep(self) -> None:
        """Close connections that stay idle or leave a frame header unfinished too long."""
        config = self.config
        interval_ms = min(config.idle_timeout_ms, config.header_timeout_ms) / 4
        interval_s = min(interval_ms, SWEEP_INTERVAL_MAX_MS) / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            now = loop.time()
            for conn in list(self._connections):
                conn.check_timeouts(now)


class _ServerConnection(asyncio.Protocol):
    """Reader, dispatcher and writer for one client connection."""

    def __init__(self, server: RpcServer, busy_poll: LoopBusyPoll) -> None:
        self._server = server
        self._busy_poll = busy_poll  # the server's: shared by its connections
        self._config = server.config
        self._handlers = server._handlers
        self._direct_handlers = server._direct_handlers
        self._decoder = FrameDecoder(frame_size_max_bytes=self._config.frame_size_max_bytes)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self._in_flight_bytes = 0
        self._write_paused = False
        self._reading = True
        self._stopped = False  # no more requests: closing, or the peer sent end of stream
        self._refused = False  # answered with an error and being closed: input is discarded
        self._linger: asyncio.TimerHandle | None = None
        self._pass_scheduled = False  # this pass dispatched its share; the next pass goes on
        # Responses finished in one loop pass, written together by one send at its end (or at
        # the end of the reader's pass that answered them).
        self._out: list[Buffer] = []
        self._processing = False
        # This connection's share of the server's unfinished-frames budget.
        self._reserved_bytes = 0
        # The last time a request arrived or the last running one finished: idleness counts from
        # the later (a long poll's answer is activity, or the sweep could close the connection
        # between that answer and the client's next request).
        self._last_active = self._loop.time()
        # When the header of frame number ``_header_frame`` began to arrive (None: no header
        # is pending).
        self._header_since: float | None = None
        self._header_frame = -1
        # Security: the identity once authenticated, and an authentication under way.
        self._security = server.security if server.security.users is not None else None
        self._observe = server.observe
        self._started: dict[int, float] = {}  # request id -> dispatch time, while metrics are kept
        self.principal: Principal | None = None
        self._by_certificate = False
        self._exchange: ScramServerExchange | None = None

    # --- asyncio.Protocol callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport = self._transport
        transport.set_write_buffer_limits(
            high=self._config.write_buffer_high_bytes, low=self._config.write_buffer_low_bytes
        )
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._security is not None:
            self.principal = self._security.principal_for_certificate(
                peer_common_name(transport.get_extra_info("ssl_object")))
            self._by_certificate = self.principal is not None  # SCRAM may still name another user
        connections = self._server._connections
        connections.add(self)
        if len(connections) > self._config.connections_max:
            self._refuse(Status.SYSTEM_BUSY,
                         f"the server has reached its maximum of {self._config.connections_max} "
                         "connections (connections_max); retry later")

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._last_active = self._loop.time()
        self._busy_poll.touch()
        self._decoder.feed(data)
        self._process()

    def eof_received(self) -> bool:
        if self._refused:
            return False  # the peer read the answer and closed: close now
        self._decoder.feed(b"")
        self._process()
        return True  # keep writing: running requests still get their responses

    def connection_lost(self, exc: Exception | None) -> None:
        self._stopped = True
        self._server._connections.discard(self)
        self._release_reservation()
        if self._linger is not None:
            self._linger.cancel()
        for task in self.tasks:
            task.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._process()

    # --- reading and dispatch ---------------------------------------------------------------

    def _blocked(self) -> bool:
        return (
            self._write_paused
            or len(self.tasks) >= self._config.in_flight_requests_max
            or self._in_flight_bytes >= self._config.in_flight_bytes_max
        )

    def _process(self) -> None:
        """Dispatch decoded frames until the decoder needs data, backpressure applies or this
        loop pass has started its share of request bytes (a later pass goes on)."""
        if self._refused:
            return
        if self._pass_scheduled:
            self._account()
            return
        self._processing = True
        try:
            self._process_frames()
        finally:
            self._processing = False
        if self._out:
            self._flush()  # what direct handlers answered in this pass

    def _process_frames(self) -> None:
        decoder = self._decoder
        share = self._config.dispatch_bytes_per_pass_max
        dispatched = 0
        while not self._stopped and not self._blocked():
            if dispatched >= share:
                self._pass_scheduled = True
                self._loop.call_soon(self._next_pass)
                break
            try:
                frame = decoder.next_frame()
            except ProtocolError as err:
                self._reply_protocol_error(err)
                if err.must_close:
                    self.close()
                    return
                continue
            if frame is Event.NEED_DATA:
                break
            if frame is Event.CLOSED:
                self._stopped = True
                break
            dispatched += len(frame.body)
            self._dispatch(frame)
        if self._stopped and not self.tasks:
            self.close()
        self._account()
        self._update_reading()

    def _next_pass(self) -> None:
        self._pass_scheduled = False
        self._process()

    def _account(self) -> None:
        """Update this connection's share of the unfinished-frames budget (refusing the
        connection whose frame would overrun it) and the start of a pending header."""
        decoder = self._decoder
        reserved = 0 if self._stopped else decoder.reserved_bytes
        grown = reserved - self._reserved_bytes
        server = self._server
        budget = self._config.unfinished_frames_bytes_max
        if grown > 0 and server.unfinished_frames_bytes + grown > budget:
            self._refuse(Status.SYSTEM_BUSY,
                         f"a frame of {reserved} bytes does not fit the server's budget of {budget} "
                         "bytes for partly received frames (unfinished_frames_bytes_max); retry later")
            return
        server.unfinished_frames_bytes += grown
        self._reserved_bytes = reserved
        if not decoder.header_pending:
            self._header_since = None
        elif self._header_since is None or self._header_frame != decoder.frames_decoded:
            self._header_since = self._loop.time()
            self._header_frame = decoder.frames_decoded

    def _release_reservation(self) -> None:
        self._server.unfinished_frames_bytes -= self._reserved_bytes
        self._reserved_bytes = 0

    def check_timeouts(self, now: float) -> None:
        """Called by the server's sweep: refuse a slow header, close an idle connection."""
        if self._refused:
            return
        config = self._config
        if self._header_since is not None and now - self._header_since >= config.header_timeout_ms / 1000:
            self._refuse(Status.TIMEOUT, f"a frame header did not arrive within {config.header_timeout_ms} "
                                         "ms (header_timeout_ms)")
        elif not self.tasks and now - self._last_active >= config.idle_timeout_ms / 1000:
            log.info("closing connection from %s: idle for %d ms", self._peer(), config.idle_timeout_ms)
            # Aborted when unsent answers remain (the peer does not read) or over TLS: a graceful
            # TLS close waits for the peer's close_notify, and an idle peer may never send one.
            transport = self._transport
            self.close(abort=transport is not None and (
                transport.get_write_buffer_size() > 0 or self._server.security.tls is not None))

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        reading = self._refused or (not self._stopped and not self._blocked())
        if reading != self._reading:
            self._reading = reading
            if reading:
                transport.resume_reading()
            else:
                transport.pause_reading()

    def stop_reading(self) -> None:
        """Take no further requests (server stopping); running handlers may still answer."""
        self._stopped = True
        self._update_reading()

    def _dispatch(self, frame: Frame) -> None:
        if self._observe is not None:
            self._started[frame.request_id] = time.perf_counter()
        if frame.is_response:
            self._reply(frame, Status.BAD_REQUEST, "a response frame was sent to a server")
            return
        if self._security is not None and not self._admitted(frame, self._security):
            return
        direct = self._direct_handlers.get(frame.code)
        if direct is not None:
            self._run_direct(direct, frame)
            return
        handler = self._handlers.get(frame.code)
        if handler is None:
            self._reply(frame, Status.UNKNOWN_CODE, f"unknown request code {frame.code}")
            return
        self._start_task(self._run(handler, frame), frame)

    def _admitted(self, frame: Frame, security: ServerSecurity) -> bool:
        """Whether ``frame`` may go on to its handler: authenticated (or PING) and authorised;
        otherwise it has been answered (AUTHENTICATE is answered here)."""
        code = frame.code
        if code == RequestCode.AUTHENTICATE:
            self._authenticate(frame, security)
            return False
        if code == RequestCode.PING:  # liveness and round trips: anyone, authenticated or not
            return True
        principal = self.principal
        if principal is None:
            audit.warning("refused request code %d from %s: not authenticated", code, self._peer())
            self._reply(frame, Status.UNAUTHENTICATED,
                        "authenticate first: give the client a user and password (GMS_USER, GMS_PASSWORD; "
                        "--user/--password) or a client certificate")
            return False
        if security.authorize is not None:
            try:
                security.authorize(principal, frame)
            except GmsError as err:
                self._failed(frame, err)
                return False
        current_principal.set(principal)
        return True

    def _authenticate(self, frame: Frame, security: ServerSecurity) -> None:
        """One SCRAM step; a failure is answered and the connection closed (no retries on it)."""
        if self.principal is not None and not self._by_certificate:
            self._reply(frame, Status.BAD_REQUEST, "this connection is already authenticated")
            return
        users = cast(Callable[[str], Any], security.users)
        if self._exchange is None:
            self._exchange = ScramServerExchange(lambda name: (u := users(name)) and u.credential)
        exchange = self._exchange
        try:
            answer, done = exchange.step(bytes(frame.body))
            user = users(exchange.username) if done and exchange.username is not None else None
            if done and user is None:
                raise UnauthenticatedError("authentication failed: the user was deleted meanwhile")
        except UnauthenticatedError as err:
            audit.warning("authentication from %s failed: %s", self._peer(), err)
            self._failed(frame, err)
            self.close()
            return
        if user is not None:
            self.principal = Principal(user.name, user.role)
            self._by_certificate = False
            self._exchange = None
            audit.info("%s authenticated as %s", self._peer(), self.principal)
        self._answer(frame, Response(body=answer))

    def _run_direct(self, handler: DirectHandler, frame: Frame) -> None:
        try:
            response = handler(frame)
        except GmsError as err:
            self._failed(frame, err)
            return
        except Exception as err:  # a handler bug must not take the connection down
            fields = self._request_fields(frame.code, frame.request_id)
            log.exception(_HANDLER_FAILED, fields, extra=fields)
            self._crashed(frame, err)
            return
        if response is None or isinstance(response, Response):
            self._answer(frame, response)
        else:  # it has to wait
            self._start_task(self._finish(response, frame), frame)

    def _start_task(self, coro: Coroutine[Any, Any, None], frame: Frame) -> None:
        task = self._loop.create_task(coro)
        self.tasks.add(task)
        self._in_flight_bytes += len(frame.body)
        size = len(frame.body)
        task.add_done_callback(lambda done: self._finished(done, size))

    def _finished(self, task: asyncio.Task[None], size: int) -> None:
        self.tasks.discard(task)
        self._in_flight_bytes -= size
        if not self.tasks:
            self._last_active = self._loop.time()
        self._process()

    async def _run(self, handler: Handler, frame: Frame) -> None:
        await self._finish(_called(handler, frame), frame)

    async def _finish(self, pending: Awaitable[Response | None], frame: Frame) -> None:
        """Await a handler's answer (a task handler's, or the rest of a direct one that has to
        wait) and send it, or the error it raised."""
        try:
            response = await pending
        except GmsError as err:
            self._failed(frame, err)
        except Exception as err:  # a handler bug must not take the connection down
            fields = self._request_fields(frame.code, frame.request_id)
            log.exception(_HANDLER_FAILED, fields, extra=fields)
            self._crashed(frame, err)
        else:
            self._answer(frame, response)

    def _answer(self, frame: Frame, response: Response | None) -> None:
        if response is None:
            self._reply(frame, Status.SUCCESS)
        else:
            self._reply(frame, Status.SUCCESS, "", response.fields, response.body)

    def _failed(self, frame: Frame, err: GmsError) -> None:
        if err.status == Status.FORBIDDEN:  # refused by the gate or, knowing the resource, by a handler
            audit.warning("refused request code %d from %s (%s): %s", frame.code, self.principal, self._peer(), err)
        if frame.is_oneway:
            fields = {**self._request_fields(frame.code, frame.request_id), "error": str(err)}
            log.warning("oneway request code %(code)d failed (request %(request_id)d from %(peer)s): %(error)s",
                        fields, extra=fields)
        self._reply(frame, err.status, str(err), err.fields)

    def _crashed(self, frame: Frame, err: Exception) -> None:
        self._reply(frame, Status.SYSTEM_ERROR, f"internal error: {type(err).__name__}: {err}")

    # --- writing ----------------------------------------------------------------------------

    def _reply(
        self,
        request: Frame,
        status: int,
        error: str = "",
        fields: Mapping[str, object] = EMPTY_FIELDS,
        body: Body = b"",
    ) -> None:
        if self._observe is not None and (started := self._started.pop(request.request_id, None)) is not None:
            self._observe(request.code, status, time.perf_counter() - started)
        if request.is_oneway:
            return
        self._write(request.code, request.request_id, status, error, fields, body)

    def _write(
        self,
        code: int,
        request_id: int,
        status: int,
        error: str,
        fields: Mapping[str, object],
        body: Body,
    ) -> None:
        transport = self._transport
        if transport is None or transport.is_closing() or self._refused:
            return
        try:
            parts = encode_frame(
                code,
                request_id,
                flags=Flag.RESPONSE,
                status=status,
                error=error,
                fields=fields,
                body=body,
                frame_size_max_bytes=self._config.frame_size_max_bytes,
            )
        except (GmsError, TypeError, ValueError, OverflowError) as err:
            # The response is too large, or its fields are not msgpack-encodable.
            fields = {**self._request_fields(code, request_id), "error": str(err)}
            log.error("response to request code %(code)d not sent (request %(request_id)d to %(peer)s): %(error)s",
                      fields, extra=fields)
            status = err.status if isinstance(err, GmsError) else Status.SYSTEM_ERROR
            parts = encode_frame(
                code, request_id, flags=Flag.RESPONSE, status=status, error=f"bad response: {err}"
            )
        if not self._out and not self._processing:
            self._loop.call_soon(self._flush)  # the reader's pass flushes by itself
        self._out += parts

    def _flush(self) -> None:
        if not self._out:
            return  # already written by close()
        out, self._out = self._out, []
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(out)
            self._busy_poll.touch()

    def _reply_protocol_error(self, err: ProtocolError) -> None:
        log.warning("protocol error from %s: %s", self._peer(), err)
        request_id = CONNECTION_ERROR_ID if err.request_id is None else err.request_id
        self._write(0, request_id, err.status, str(err), EMPTY_FIELDS, b"")

    def _refuse(self, status: Status, message: str) -> None:
        """Answer ``message`` under id 0 and close: once the peer closes its side, or after
        REFUSED_LINGER_MS; until then its input is read and dropped (see REFUSED_LINGER_MS)."""
        _refusals_log.warning("refusing connection from %s: %s", self._peer(), message)
        self._write(0, CONNECTION_ERROR_ID, status, message, EMPTY_FIELDS, b"")
        self._flush()
        self._refused = self._stopped = True
        self._release_reservation()
        self._header_since = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        self._update_reading()
        self._linger = self._loop.call_later(REFUSED_LINGER_MS / 1000, functools.partial(self.close, abort=True))

    def _peer(self) -> str:
        """The client's ``host:port``, as log and audit lines name it."""
        return peer_address(None if self._transport is None else self._transport.get_extra_info("peername"))

    def _request_fields(self, code: int, request_id: int) -> dict[str, object]:
        """What names a request in the lines logged about it: the arguments of their templates and
        their ``extra`` fields, which json logs show as keys of their own."""
        return {"request_id": request_id, "code": code, "peer": self._peer()}

    def buffered_bytes(self) -> int:
        unsent = 0 if self._transport is None else self._transport.get_write_buffer_size()
        return self._decoder.buffered_bytes + unsent + self._in_flight_bytes

    def close(self, *, abort: bool = False) -> None:
        """Close after flushing what is buffered (or at once with ``abort``)."""
        self._stopped = True
        if self._out and not abort:
            self._flush()
        if self._transport is not None and (abort or not self._transport.is_closing()):
            if abort:
                self._transport.abort()
            else:
                self._transport.close()


async def _called(handler: Handler, frame: Frame) -> Response | None:
    """``handler(frame)`` called inside the awaited coroutine, so that whatever it raises is
    answered like an error of its awaitable."""
    return await handler(frame)
