"""SCRAM-SHA-256 (RFC 5802 / 7677) over gms's AUTHENTICATE request, with ``scramp``.

Why SCRAM rather than RocketMQ's access key + HMAC-signed requests: SCRAM proves the password
once per connection (Kafka's SASL/SCRAM), so an authenticated request costs nothing more, while
signing every request costs an HMAC over it; the server stores only a salted verifier
(``stored_key``, ``server_key``), so a leaked credential store does not reveal passwords and
cannot be replayed; and the client checks the server's signature, so a false server is caught.

The exchange is two AUTHENTICATE requests (client-first → server-first, client-final →
server-final); their bodies are the SCRAM messages. Both ends are sans-IO here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import scramp

from gms.errors import UnauthenticatedError

MECHANISM = "SCRAM-SHA-256"
# RFC 7677 asks for at least 4096; the cost is the client's, once per connection (~1.5 ms).
ITERATIONS = 4096
_MECHANISM = scramp.ScramMechanism(MECHANISM)
_USERNAME = re.compile(r"(?:^|,)n=([^,]*)")
# Unknown users get a made-up salt that stays the same for the name (as a real one would), so
# neither the first answer nor its timing tells which names exist.
_DECOY_KEY = secrets.token_bytes(32)


@dataclass(frozen=True)
class Credential:
    """A user's salted SCRAM verifier: what the cluster stores instead of the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def for_password(cls, password: str, iterations: int = ITERATIONS) -> Credential:
        if not password:
            raise ValueError("the password must not be empty")
        salt, stored_key, server_key, count = _MECHANISM.make_auth_info(password, iteration_count=iterations)
        return cls(salt, stored_key, server_key, count)

    def to_json(self) -> dict[str, object]:
        encode = base64.b64encode
        return {"mechanism": MECHANISM, "salt": encode(self.salt).decode(), "iterations": self.iterations,
                "stored_key": encode(self.stored_key).decode(), "server_key": encode(self.server_key).decode()}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Credential:
        decode = base64.b64decode
        return cls(decode(str(data["salt"])), decode(str(data["stored_key"])), decode(str(data["server_key"])),
                   int(data["iterations"]))  # type: ignore[call-overload]

    def dumps(self) -> str:
        return json.dumps(self.to_json())


class ScramServerExchange:
    """The server's side of one authentication: feed the client's messages to :meth:`step`."""

    def __init__(self, lookup: Callable[[str], Credential | None]) -> None:
        self._lookup = lookup
        self._server: scramp.ScramServer | None = None
        self._name = ""
        self._known = False
        self.username: str | None = None  # set once the exchange succeeded

    def step(self, message: bytes) -> tuple[bytes, bool]:
        """The answer to ``message`` and whether the client is now authenticated.
        :class:`UnauthenticatedError` for unknown users, wrong passwords and bad messages (the
        same words for all three)."""
        try:
            text = message.decode()
            if self._server is None:
                match = _USERNAME.search(text)
                self._name = _unescape(match.group(1)) if match else ""
                credential = self._lookup(self._name) if self._name else None
                self._known = credential is not None
                if credential is None:
                    credential = _decoy(self._name)
                server = self._server = _MECHANISM.make_server(
                    lambda _: (credential.salt, credential.stored_key, credential.server_key, credential.iterations))
                server.set_client_first(text)
                return server.get_server_first().encode(), False
            self._server.set_client_final(text)
            if not self._known:
                raise UnauthenticatedError(_REFUSED)
            self.username = self._name
            return self._server.get_server_final().encode(), True
        except (scramp.ScramException, UnicodeDecodeError) as err:
            raise UnauthenticatedError(_REFUSED) from err


_REFUSED = "authentication failed: unknown user or wrong password"


def _decoy(name: str) -> Credential:
    salt = hmac.new(_DECOY_KEY, name.encode(), hashlib.sha256).digest()
    return Credential(salt, secrets.token_bytes(32), secrets.token_bytes(32), ITERATIONS)


class ScramClientExchange:
    """The client's side: :meth:`first`, then :meth:`final` with the server's first answer, then
    :meth:`verify` with its last (which proves the server knew the verifier)."""

    def __init__(self, username: str, password: str) -> None:
        self._client = scramp.ScramClient([MECHANISM], username, password)

    def first(self) -> bytes:
        return self._client.get_client_first().encode()

    def final(self, server_first: bytes) -> bytes:
        try:
            self._client.set_server_first(server_first.decode())
            return self._client.get_client_final().encode()
        except (scramp.ScramException, UnicodeDecodeError) as err:
            raise UnauthenticatedError(f"the server's SCRAM answer is not valid: {err}") from err

    def verify(self, server_final: bytes) -> None:
        try:
            self._client.set_server_final(server_final.decode())
        except (scramp.ScramException, UnicodeDecodeError) as err:
            raise UnauthenticatedError(f"the server could not prove it knows the credential: {err}") from err


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")
