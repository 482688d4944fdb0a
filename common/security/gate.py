"""What a gms listener enforces: TLS, who may talk to it, and what each identity may ask.

:class:`gms.net.server.RpcServer` takes one :class:`ServerSecurity`. With ``users`` set, a
connection must authenticate (SCRAM over AUTHENTICATE, or a verified client certificate
when ``cert_users``) before any request but PING; every later request then goes through
``authorize``, which raises :class:`ForbiddenError`. Refusals are written to the
``gms.audit`` log.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from gms.errors import ForbiddenError
from gms.protocol.frame import Frame
from gms.security.users import Principal, User

audit = logging.getLogger("gms.audit")

# A TLS handshake, and the close_notify exchange of a graceful close, must be over this soon
# (asyncio's defaults: 60 s and 30 s): a client silent in either holds a descriptor, outside the
# idle and header timeouts, which count from a finished handshake. A handshake is two round
# trips and some milliseconds of work.
TLS_HANDSHAKE_TIMEOUT_MS = 10_000

Authorize = Callable[[Principal, Frame], None]

# The principal of the request a handler is running for (None: authentication is off). Handlers
# that learn the resources only while working (the topics of a send batch) check them against it.
current_principal: ContextVar[Principal | None] = ContextVar("current_principal", default=None)


@dataclass(frozen=True)
class ServerSecurity:
    tls: ssl.SSLContext | None = None
    # The user of a name (None: unknown); None here means no authentication is asked for.
    users: Callable[[str], User | None] | None = None
    # Raises ForbiddenError when the principal may not make the request.
    authorize: Authorize | None = None
    # A client certificate verified against the CA authenticates as the user its CN names.
    cert_users: bool = False
    tls_handshake_timeout_ms: int = TLS_HANDSHAKE_TIMEOUT_MS

    def principal_for_certificate(self, common_name: str | None) -> Principal | None:
        """The principal a verified client certificate stands for (None: it does not)."""
        if not self.cert_users or not common_name or self.users is None:
            return None
        user = self.users(common_name)
        return Principal(common_name, user.role if user is not None else "normal")


def forbidden(principal: Principal, resource: str, operation: str, why: str = "") -> ForbiddenError:
    """The error for a refused request (the caller raises it)."""
    message = f"{principal} may not {operation} {resource}" + (f": {why}" if why else "")
    return ForbiddenError(message, fields={"principal": str(principal), "resource": resource,
                                           "operation": operation})
