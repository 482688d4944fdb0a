"""The monitoring endpoint of a broker or nameserver (aiohttp, on the server's event loop):

- ``/metrics``: the server's registry in Prometheus' text format;
- ``/healthz``: 200 while the process serves at all (liveness);
- ``/readyz``: 200 when ``problems()`` is empty, else 503 with one problem per line
  (readiness: store open, registered, leases held...).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MonitoringServer:
    """Serving once made (:meth:`start`); :meth:`stop` closes it."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self._runner = runner
        self.port = port

    @classmethod
    async def start(cls, host: str, port: int, registry: CollectorRegistry,
                    problems: Callable[[], list[str]]) -> MonitoringServer:
        """Listen on ``host:port`` (0: a free port, see :attr:`port`)."""

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(request: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def readyz(request: web.Request) -> web.Response:
            found = problems()
            if found:
                return web.Response(status=503, text="".join(f"{p}\n" for p in found))
            return web.Response(text="ready\n")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        return cls(runner, int(runner.addresses[0][1]))

    async def stop(self) -> None:
        await self._runner.cleanup()
