"""The RPC server: frames in, handlers run concurrently, responses out in completion order.

:class:`RpcServer` listens (over TLS when its security says so), keeps the handlers by request
code and the connections, sweeps them for timeouts and stops them with a grace period. Each
client's connection (:class:`gms.net.server_connection.ServerConnection`) reads, dispatches and
answers its own requests under the limits of :class:`ServerConfig`.

Limits across connections (:class:`ServerConfig`): a maximum connection count, a server-wide
budget for bytes held in partly received frames, and idle / slow-header timeouts. A
connection refused by one of them gets an error response under id 0 before it is closed.
Fairness: one connection starts at most ``dispatch_bytes_per_pass_max`` of request bodies per
event-loop pass, so pipelined big batches take turns with other clients' requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gms.net.busy_poll import SERVER_WINDOW_US, LoopBusyPoll
from gms.net.server_connection import CONNECTION_ERROR_ID, ServerConnection
from gms.protocol.codes import RequestCode
from gms.protocol.frame import FRAME_SIZE_MAX_BYTES, Frame, Response
from gms.security.gate import ServerSecurity

__all__ = ["CONNECTION_ERROR_ID", "DirectHandler", "Handler", "RequestObserver", "RpcServer", "ServerConfig"]

Handler = Callable[[Frame], Awaitable[Response | None]]
# A handler that answers at once when it can (a plain function, not an ``async def``): called in
# the reader's loop pass, it returns the response (or None), or an awaitable when it must wait
# (then run as a task, like a Handler).
# A request answered at once costs no task and no extra loop pass: about a third of a small
# request's server time. It runs outside any task, so before it returns an awaitable it must not
# use what needs one (asyncio.timeout, current_task).
DirectHandler = Callable[[Frame], "Response | Awaitable[Response | None] | None"]
RequestObserver = Callable[[int, int, float], None]  # (request code, status, seconds): metrics

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
        self._connections: set[ServerConnection] = set()
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
            lambda: ServerConnection(self, busy_poll), host, port, reuse_address=True, ssl=tls,
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
