"""What keeps other web sites out of the console through an operator's browser.

- **Host names.** A hostile page whose domain resolves to the console's address (DNS rebinding)
  counts as the console's own origin, so it could read the cluster and drive admin actions. The
  console answers requests addressed to an IP address, ``localhost``, or a name given with
  ``--allow-host`` (the name a reverse proxy forwards, or users type); other names are refused.
  Vite's dev server (``server.allowedHosts``) uses the same rule.
- **Origin.** An admin action must come from the console's own pages: when a browser names the
  posting page's ``Origin``, its host must be the one the request is addressed to (the scheme
  may differ behind a TLS-terminating proxy).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gms.console.http_errors import Refused

ALWAYS_ALLOWED_NAMES = frozenset({"localhost"})


def host_guard(allowed_names: Iterable[str]) -> Middleware:
    """A middleware refusing requests addressed to a host name not allowed (IP addresses always are)."""
    allowed = ALWAYS_ALLOWED_NAMES | {name.lower() for name in allowed_names}

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = (request.url.host or "").lower()
        if host not in allowed and not _is_ip_address(host):
            raise Refused(403, "HostRefused", f"this console does not answer requests addressed to {host!r} (a guard"
                                              " against DNS rebinding): open it by IP address or localhost, or"
                                              f" restart it with --allow-host {host} if that is its name")
        return await handler(request)

    return guard


def check_same_origin(request: web.Request) -> None:
    """Refused unless the request names no ``Origin``, or one on the host it is addressed to."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise Refused(403, "CrossSiteRequest", f"cross-site request from {origin} refused: use the console's own pages")


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
