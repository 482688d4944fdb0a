"""One client's connection to the RPC server (:mod:`gms.net.server`): an ``asyncio.Protocol``
that reads frames, dispatches them to the server's handlers and writes the answers.

Its reader decodes frames with the sans-IO decoder and starts one task per request, so a
long-polling pull does not hold up other requests on the same connection; each response goes
out when its handler finishes, matched by request id. Backpressure: reading pauses while too
many requests (or request bytes) are in flight or while the transport's write buffer is above
its high-water mark, so neither a flood of requests nor a client that does not read its
responses can grow server memory without bound. With the server's users set, a request goes on
only from an authenticated peer (a client certificate's user, or a SCRAM exchange on the
connection) that the server's authorizer lets through.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

from gms.address import peer_address
from gms.errors import GmsError, ProtocolError, UnauthenticatedError
from gms.log_throttle import RepeatFilter
from gms.net.busy_poll import LoopBusyPoll
from gms.net.writes import write_parts
from gms.protocol.codes import Flag, RequestCode, Status
from gms.protocol.decoder import Event, FrameDecoder
from gms.protocol.frame import EMPTY_FIELDS, Body, Buffer, Frame, Response, encode_frame
from gms.security.gate import ServerSecurity, audit, current_principal
from gms.security.scram import ScramServerExchange
from gms.security.tls import peer_common_name
from gms.security.users import Principal

if TYPE_CHECKING:
    from gms.net.server import DirectHandler, Handler, RpcServer

# The server's log: its lines keep the one logger name operators configure, whichever module writes them.
log = logging.getLogger("gms.net.server")
# A flood of refused connections is logged once a minute, with a count.
_refusals_log = logging.getLogger("gms.net.server.refusals")
_refusals_log.addFilter(RepeatFilter())

# A handler's bug, logged with the request it failed (see _request_fields for the arguments).
_HANDLER_FAILED = "handler for request code %(code)d failed (request %(request_id)d from %(peer)s)"

# Responses to errors that no request id can be attached to (garbage before the first
# frame boundary) carry this id; clients never use it for requests.
CONNECTION_ERROR_ID = 0

# A refused connection is answered, half-closed and drained this long before it is dropped:
# closing a socket with unread input resets it, which can destroy the answer unread.
REFUSED_LINGER_MS = 1000


class ServerConnection(asyncio.Protocol):
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
            write_parts(transport, out)
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
