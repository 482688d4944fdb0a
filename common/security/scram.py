"""SCRAM-SHA-256 (RFC 5802 / 7677) over gms's AUTHENTICATE request, with ``scramp``.

Why SCRAM rather than RocketMQ's access key + HMAC-signed requests: SCRAM proves the password
once per connection (Kafka's SASL/SCRAM), so an authenticated request costs nothing more, while
signing every request costs an HMAC over it; the server stores only a salted verifier
(``stored_key``, ``server_key``), so a leaked credential store does not reveal passwords and
cannot be replayed; and the client checks the server's signature, so a false server is caught.

A credential made from a password holds the SCRAM-SHA-512 verifier of the same password beside the
SHA-256 one (each with its own salt): gms's port exchanges SCRAM-SHA-256 only, its Kafka port
either, as Kafka's clients choose (``sasl.mechanism``). A verifier is derived from the password, so
users stored before SHA-512 verifiers were kept have none until their password is set again.

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
SHA512 = "SCRAM-SHA-512"
# RFC 7677 asks for at least 4096; the cost is the client's, once per connection (~1.5 ms).
ITERATIONS = 4096
_MECHANISMS = {name: scramp.ScramMechanism(name) for name in (MECHANISM, SHA512)}
_MECHANISM = _MECHANISMS[MECHANISM]
_USERNAME = re.compile(r"(?:^|,)n=([^,]*)")
# Unknown users get a made-up salt that stays the same for the name (as a real one would), so
# neither the first answer nor its timing tells which names exist.
_DECOY_KEY = secrets.token_bytes(32)


@dataclass(frozen=True)
class Credential:
    """A user's salted SCRAM verifier: what the cluster stores instead of the password.
    ``sha512``: the same password's SCRAM-SHA-512 verifier (None: the user's was stored without)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int
    sha512: Credential | None = None

    @classmethod
    def for_password(cls, password: str, iterations: int = ITERATIONS) -> Credential:
        if not password:
            raise ValueError("the password must not be empty")
        salt, stored_key, server_key, count = _MECHANISM.make_auth_info(password, iteration_count=iterations)
        sha512 = cls(*_MECHANISMS[SHA512].make_auth_info(password, iteration_count=iterations))
        return cls(salt, stored_key, server_key, count, sha512)

    def for_mechanism(self, mechanism: str) -> Credential | None:
        """The verifier a SCRAM exchange of ``mechanism`` checks (None: this credential has none)."""
        return self if mechanism == MECHANISM else self.sha512 if mechanism == SHA512 else None

    def to_json(self) -> dict[str, object]:
        encode = base64.b64encode
        data: dict[str, object] = {
            "mechanism": MECHANISM, "salt": encode(self.salt).decode(), "iterations": self.iterations,
            "stored_key": encode(self.stored_key).decode(), "server_key": encode(self.server_key).decode()}
        if self.sha512 is not None:
            data["sha512"] = {key: value for key, value in self.sha512.to_json().items() if key != "mechanism"}
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Credential:
        decode = base64.b64decode
        sha512 = data.get("sha512")
        if sha512 is not None and not isinstance(sha512, dict):
            raise ValueError("sha512 must be an object")
        return cls(decode(str(data["salt"])), decode(str(data["stored_key"])), decode(str(data["server_key"])),
                   int(data["iterations"]),  # type: ignore[call-overload]
                   None if sha512 is None else cls.from_json(sha512))

    def dumps(self) -> str:
        return json.dumps(self.to_json())


class ScramServerExchange:
    """The server's side of one authentication: feed the client's messages to :meth:`step`.
    ``lookup(name)``: the user's verifier for ``mechanism`` (None: unknown, or none for it)."""

    def __init__(self, lookup: Callable[[str], Credential | None], mechanism: str = MECHANISM) -> None:
        self._lookup = lookup
        self._mechanism = _MECHANISMS[mechanism]
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
                    credential = _decoy(self._name, self._mechanism)
                server = self._server = self._mechanism.make_server(
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


def _decoy(name: str, mechanism: scramp.ScramMechanism) -> Credential:
    salt = hmac.new(_DECOY_KEY, name.encode(), hashlib.sha256).digest()
    size = 64 if mechanism.name == SHA512 else 32
    return Credential(salt, secrets.token_bytes(size), secrets.token_bytes(size), ITERATIONS)


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
