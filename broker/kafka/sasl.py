"""Who a Kafka connection is: SASL (SaslHandshake v1, then SaslAuthenticate) against gms's users,
or a verified client certificate (docs/security.md, docs/kafka-compat.md).

With authentication on, a connection must authenticate before any request but ApiVersions and the
two SASL ones (anything else closes it, as Kafka closes it). Mechanisms:

- ``SCRAM-SHA-256``: the exchange gms's own clients make (``gms.security.scram``), against the
  verifier each user has in etcd: the password never crosses the wire;
- ``SCRAM-SHA-512``: the same against the user's SHA-512 verifier, stored beside the SHA-256 one
  when its password is set (a user stored without one is refused as a wrong password would be);
- ``PLAIN`` (user and password in the clear, checked against the same verifier), offered only on a
  TLS listener.

A refused exchange answers SASL_AUTHENTICATION_FAILED (the same words for an unknown user and a
wrong password) and closes the connection. A client certificate verified against ``tls_ca``
(``tls_client_auth``) authenticates the connection as the user its common name names, as on
gms's own port; a SASL exchange on it replaces that identity. Successes and refusals are lines on
the ``gms.audit`` logger.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from gms.broker.kafka.errors import Err
from gms.errors import UnauthenticatedError
from gms.security.gate import ServerSecurity, audit
from gms.security.scram import ITERATIONS, Credential, ScramServerExchange
from gms.security.scram import MECHANISM as SCRAM
from gms.security.scram import SHA512 as SCRAM_SHA512
from gms.security.tls import peer_common_name
from gms.security.users import Principal

PLAIN = "PLAIN"
_REFUSED = "authentication failed: unknown user or wrong password"
_UNKNOWN = Credential(b"\0" * 16, b"", b"", ITERATIONS)  # never matches: an empty stored key


class SaslSession:
    """One connection's identity and its SASL exchange under way."""

    def __init__(self, security: ServerSecurity, ssl_object: Any, peer: str) -> None:
        self.security = security
        self.peer = peer
        self.mechanisms = [SCRAM, SCRAM_SHA512, PLAIN] if security.tls is not None else [SCRAM, SCRAM_SHA512]
        self.principal: Principal | None = security.principal_for_certificate(peer_common_name(ssl_object))
        self.closing = False  # a refused exchange: the connection closes once the answer is sent
        self._mechanism: str | None = None
        self._scram: ScramServerExchange | None = None
        if self.principal is not None:
            audit.info("kafka client %s authenticated as %s by its certificate", peer, self.principal)

    @property
    def required(self) -> bool:
        return self.security.users is not None

    def handshake(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        offered = self.mechanisms if self.required else []
        mechanism = req["mechanism"]
        if mechanism not in offered:
            return {"error_code": Err.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}
        self._mechanism = mechanism
        self._scram = None
        return {"error_code": 0, "mechanisms": offered}

    def authenticate(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        if self._mechanism is None:
            self.closing = True
            return {"error_code": Err.ILLEGAL_SASL_STATE, "error_message": "SaslHandshake first", "auth_bytes": b""}
        try:
            answer, user = (self._plain(bytes(req["auth_bytes"])) if self._mechanism == PLAIN
                            else self._scram_step(bytes(req["auth_bytes"])))
        except UnauthenticatedError as err:
            audit.warning("kafka client %s: %s authentication failed: %s", self.peer, self._mechanism, err)
            self.closing = True
            return {"error_code": Err.SASL_AUTHENTICATION_FAILED, "error_message": str(err), "auth_bytes": b""}
        if user is not None:
            audit.info("kafka client %s authenticated as %s (%s)", self.peer, user, self._mechanism)
            self.principal = user
            self._mechanism = None
        return {"error_code": 0, "error_message": None, "auth_bytes": answer, "session_lifetime_ms": 0}

    def _scram_step(self, message: bytes) -> tuple[bytes, Principal | None]:
        users = self.security.users
        assert users is not None
        if self._scram is None:
            mechanism = self._mechanism
            assert mechanism is not None
            self._scram = ScramServerExchange(
                lambda name: user.credential.for_mechanism(mechanism) if (user := users(name)) else None, mechanism)
        exchange = self._scram
        answer, done = exchange.step(message)
        if not done or exchange.username is None:
            return answer, None
        self._scram = None
        return answer, self._principal(exchange.username)

    def _plain(self, message: bytes) -> tuple[bytes, Principal]:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise UnauthenticatedError(_REFUSED)
        _, name, password = (part.decode(errors="replace") for part in parts)
        users = self.security.users
        assert users is not None
        user = users(name)
        # an unknown user costs the same PBKDF2 as a known one: the time taken tells no names
        credential = user.credential if user is not None else _UNKNOWN
        if not _password_matches(password, credential.salt, credential.iterations, credential.stored_key) or not user:
            raise UnauthenticatedError(_REFUSED)
        return b"", Principal(user.name, user.role)

    def _principal(self, name: str) -> Principal:
        users = self.security.users
        assert users is not None
        user = users(name)
        if user is None:
            raise UnauthenticatedError("authentication failed: the user was deleted meanwhile")
        return Principal(user.name, user.role)


def _password_matches(password: str, salt: bytes, iterations: int, stored_key: bytes) -> bool:
    """Whether ``password`` is the one SCRAM's verifier (RFC 5802's StoredKey) was made of."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)
