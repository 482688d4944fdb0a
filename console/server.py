"""The console's HTTP server: the pages (one HTML shell whose script renders each path), their
static files, the JSON API and the sampler, over one :class:`gms.client.Admin` client.

Fits :func:`gms.net.serve.serve_until_signalled` (``start``, ``port``, ``stop``), which runs it
in ``gms console`` and ``python -m gms.console``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gms.client import Admin
from gms.console import ADMIN_HOW
from gms.console.actions import AdminActions
from gms.console.api import ConsoleApi
from gms.console.data import ConsoleData
from gms.console.guards import host_guard
from gms.console.history import History
from gms.console.http_errors import json_errors
from gms.console.sampler import Sampler
from gms.security.client import ClientSecurity

STATIC_DIR = Path(__file__).parent / "static"
PAGE = STATIC_DIR / "index.html"
# Paths that are pages: the shell is served for each and its script renders the path.
PAGE_PATHS = ("/", "/topics", "/topics/{topic}", "/groups", "/groups/{group}", "/messages")
# A page waits on these reads: fail in seconds, not after the SDK's 30 s default.
REQUEST_TIMEOUT_MS = 10_000
REQUEST_BODY_BYTES_MAX = 64 * 1024  # an admin action's JSON is a few fields


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    nameserver: str  # host:port[,host:port]
    host: str
    port: int  # 0: a free one (see ConsoleServer.port once started)
    admin: bool = False  # admin actions (create topic, reset offsets) on
    admin_how: str = ADMIN_HOW  # the command line that turns them on, for the read-only notes
    allowed_hosts: tuple[str, ...] = ()  # host names answered besides IP addresses and localhost
    sample_interval_s: float = 5.0
    history_s: float = 900.0  # how far back charts reach


class ConsoleServer:
    def __init__(self, settings: ConsoleSettings, security: ClientSecurity) -> None:
        """``security``: TLS and user the console connects to the cluster with."""
        self.settings = settings
        self._admin = Admin(nameserver=settings.nameserver, security=security, request_timeout_ms=REQUEST_TIMEOUT_MS)
        data = ConsoleData(self._admin)
        history = History(interval_s=settings.sample_interval_s, window_s=settings.history_s)
        self._sampler = Sampler(data, history)
        self._app = web.Application(middlewares=[json_errors, host_guard(settings.allowed_hosts)],
                                    client_max_size=REQUEST_BODY_BYTES_MAX)
        ConsoleApi(data, history, AdminActions(self._admin) if settings.admin else None,
                   nameserver=settings.nameserver, admin_how=settings.admin_how).add_routes(self._app)
        self._app.add_routes([web.get(path, _page) for path in PAGE_PATHS])
        self._app.router.add_static("/static/", STATIC_DIR)
        self._app.router.add_get("/{path:.*}", _no_page)
        self._runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the console is not serving yet: start() it first")
        return self._port

    async def start(self) -> None:
        """Listen (OSError if the address is taken) and start sampling."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            await asyncio.to_thread(self._admin.close)
            raise
        self._port = int(self._runner.addresses[0][1])
        self._sampler.start()

    async def stop(self) -> None:
        await self._sampler.stop()
        await self._runner.cleanup()
        await asyncio.to_thread(self._admin.close)


async def _page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache"})


async def _no_page(request: web.Request) -> web.FileResponse:
    """Any other path: the shell with status 404, whose script says there is no such page (an
    unknown API path stays a JSON 404)."""
    if request.path.startswith("/api/"):
        raise web.HTTPNotFound()
    return web.FileResponse(PAGE, status=404, headers={"Cache-Control": "no-cache"})
