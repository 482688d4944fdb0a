"""TLS and SCRAM authentication on a real RpcServer over loopback sockets, with both clients (the
pipelined asyncio Connection and the BlockingConnection), on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from net_helpers import Runner

from gms.address import peer_address
from gms.errors import (
    ConnectionClosedError,
    ForbiddenError,
    ServiceUnavailableError,
    UnauthenticatedError,
)
from gms.net import Connection, LoopThread, RpcServer
from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame, Response
from gms.security.client import ClientSecurity
from gms.security.devca import ensure_dev_pki
from gms.security.gate import ServerSecurity, forbidden
from gms.security.scram import Credential
from gms.security.tls import TlsFiles
from gms.security.users import Principal, User

USERS = {"alice": User("alice", "normal", Credential.for_password("s3cret")),
         "root": User("root", "super", Credential.for_password("r00t"))}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return ensure_dev_pki(tmp_path_factory.mktemp("pki"))


def only_super_creates(principal: Principal, frame: Frame) -> None:
    if frame.code == RequestCode.CREATE_TOPIC and principal.role != "super":
        raise forbidden(principal, "cluster", "admin")


async def whoami(frame: Frame) -> Response:
    return Response({"ok": True})


def secured_server(pki=None, *, cert_users: bool = False) -> RpcServer:
    tls = (TlsFiles(str(pki.ca_cert), str(pki.server_cert), str(pki.server_key)).server_context(
        require_client_cert=cert_users) if pki is not None else None)
    security = ServerSecurity(tls=tls, users=USERS.get, authorize=only_super_creates, cert_users=cert_users)
    return RpcServer({RequestCode.TOPIC_LIST: whoami, RequestCode.CREATE_TOPIC: whoami}, security=security)


def client_security(pki=None, user: str = "", password: str = "", *, cert: bool = False) -> ClientSecurity:
    tls = None
    if pki is not None:
        tls = TlsFiles(str(pki.ca_cert), str(pki.client_cert) if cert else "", str(pki.client_key) if cert else "")
    return ClientSecurity(tls, user, password)


def test_requests_need_authentication_and_roles_are_enforced(arun: Runner, pki):
    async def main() -> None:
        server = secured_server(pki)
        await server.start("127.0.0.1", 0)
        try:
            anonymous = await Connection.open("127.0.0.1", server.port, security=client_security(pki))
            await anonymous.request(RequestCode.PING, None, b"hi")  # liveness needs no identity
            with pytest.raises(UnauthenticatedError, match="authenticate first"):
                await anonymous.request(RequestCode.TOPIC_LIST)
            anonymous.close()
            alice = await Connection.open("127.0.0.1", server.port, security=client_security(pki, "alice", "s3cret"))
            assert (await alice.request(RequestCode.TOPIC_LIST)).fields["ok"]
            with pytest.raises(ForbiddenError) as refused:
                await alice.request(RequestCode.CREATE_TOPIC)
            assert refused.value.fields["principal"] == "normal:alice"
            assert refused.value.fields["resource"] == "cluster"
            assert (await alice.request(RequestCode.TOPIC_LIST)).fields["ok"]  # the connection goes on
            alice.close()
            root = await Connection.open("127.0.0.1", server.port, security=client_security(pki, "root", "r00t"))
            assert (await root.request(RequestCode.CREATE_TOPIC)).fields["ok"]
            root.close()
        finally:
            await server.stop()

    arun(main())


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("mallory", "s3cret")])
def test_wrong_password_and_unknown_user_are_refused_alike(arun: Runner, pki, user, password):
    async def main() -> None:
        server = secured_server(pki)
        await server.start("127.0.0.1", 0)
        try:
            with pytest.raises(UnauthenticatedError, match="unknown user or wrong password"):
                await Connection.open("127.0.0.1", server.port, security=client_security(pki, user, password))
            # The server keeps serving others.
            ok = await Connection.open("127.0.0.1", server.port, security=client_security(pki, "alice", "s3cret"))
            assert (await ok.request(RequestCode.TOPIC_LIST)).fields["ok"]
            ok.close()
        finally:
            await server.stop()

    arun(main())


def test_blocking_connection_over_tls_with_scram(pki):
    loop_thread = LoopThread(name="test-server")
    server = secured_server(pki)
    try:
        loop_thread.run(server.start("127.0.0.1", 0))
        conn = BlockingConnection.open("127.0.0.1", server.port, security=client_security(pki, "alice", "s3cret"))
        for _ in range(3):
            assert conn.request(RequestCode.TOPIC_LIST, timeout_ms=5000).fields["ok"]
        big = bytes(range(256)) * 4096  # a 1 MiB echo crosses many TLS records
        assert bytes(conn.request(RequestCode.PING, None, big, timeout_ms=5000).body) == big
        conn.close()
        with pytest.raises(UnauthenticatedError):
            BlockingConnection.open("127.0.0.1", server.port, security=client_security(pki, "alice", "nope"))
        with pytest.raises(ServiceUnavailableError, match="not trusted"):  # the system CAs do not know ours
            BlockingConnection.open("127.0.0.1", server.port, security=ClientSecurity(TlsFiles(), "alice", "s3cret"))
    finally:
        loop_thread.run(server.stop())
        loop_thread.stop()


def test_plaintext_client_to_a_tls_listener_fails_cleanly(arun: Runner, pki):
    async def main() -> None:
        server = secured_server(pki)
        await server.start("127.0.0.1", 0)
        try:
            conn = await Connection.open("127.0.0.1", server.port)
            with pytest.raises((ConnectionClosedError, asyncio.TimeoutError)):
                await conn.request(RequestCode.PING, None, b"x", timeout_ms=3000)
            conn.close()
            ok = await Connection.open("127.0.0.1", server.port, security=client_security(pki, "alice", "s3cret"))
            assert (await ok.request(RequestCode.TOPIC_LIST)).fields["ok"]
            ok.close()
        finally:
            await server.stop()

    arun(main())


def test_a_verified_client_certificate_authenticates_as_its_common_name(arun: Runner, pki):
    async def main() -> None:
        server = secured_server(pki, cert_users=True)
        await server.start("127.0.0.1", 0)
        try:
            conn = await Connection.open("127.0.0.1", server.port, security=client_security(pki, cert=True))
            assert (await conn.request(RequestCode.TOPIC_LIST)).fields["ok"]
            with pytest.raises(ForbiddenError, match="normal:admin"):  # CN "admin", no user record
                await conn.request(RequestCode.CREATE_TOPIC)
            conn.close()
            # Mutual TLS required: a client without a certificate does not get through.
            with pytest.raises((ServiceUnavailableError, ConnectionClosedError, ssl.SSLError)):
                bare = await Connection.open("127.0.0.1", server.port, security=client_security(pki))
                await bare.request(RequestCode.PING, None, b"x", timeout_ms=3000)
        finally:
            await server.stop()

    arun(main())


@pytest.fixture(scope="module")
def expired_pki(tmp_path_factory):
    """Certificates that expired a moment ago (the same CA shape as the good ones)."""
    import time
    pki = ensure_dev_pki(tmp_path_factory.mktemp("expired"), valid_days=0)
    time.sleep(1.1)  # not_valid_after is now, to the second
    return pki


def test_an_expired_server_certificate_is_refused(arun: Runner, expired_pki):
    async def main() -> None:
        server = secured_server(expired_pki)
        await server.start("127.0.0.1", 0)
        try:
            with pytest.raises(ServiceUnavailableError, match="expired"):
                await Connection.open("127.0.0.1", server.port,
                                      security=client_security(expired_pki, "alice", "s3cret"))
        finally:
            await server.stop()

    arun(main())


def test_an_expired_or_foreign_client_certificate_is_refused(arun: Runner, pki, expired_pki, tmp_path):
    """Mutual TLS: a client certificate that expired, or that another CA signed, gets no connection."""
    foreign = ensure_dev_pki(tmp_path / "foreign")

    async def main() -> None:
        server = secured_server(pki, cert_users=True)
        await server.start("127.0.0.1", 0)
        try:
            for bad in (expired_pki, foreign):
                tls = TlsFiles(str(pki.ca_cert), str(bad.client_cert), str(bad.client_key))
                with pytest.raises((ServiceUnavailableError, ConnectionClosedError, UnauthenticatedError)):
                    conn = await Connection.open("127.0.0.1", server.port,
                                                 security=ClientSecurity(tls, "alice", "s3cret"))
                    await conn.request(RequestCode.TOPIC_LIST, timeout_ms=3000)
            good = await Connection.open("127.0.0.1", server.port, security=client_security(pki, cert=True))
            assert (await good.request(RequestCode.TOPIC_LIST)).fields["ok"]  # the certificate's CN: admin
            good.close()
        finally:
            await server.stop()

    arun(main())


def test_scram_on_a_certificate_authenticated_connection_names_the_user(arun: Runner, pki):
    """A broker presents its certificate and then authenticates as its own identity: SCRAM on a
    connection a client certificate already authenticated replaces that identity."""
    async def main() -> None:
        server = secured_server(pki, cert_users=True)
        await server.start("127.0.0.1", 0)
        try:
            root = await Connection.open("127.0.0.1", server.port, security=client_security(pki, "root", "r00t",
                                                                                               cert=True))
            assert (await root.request(RequestCode.CREATE_TOPIC)).fields["ok"]  # super, not the CN's normal user
            root.close()
        finally:
            await server.stop()

    arun(main())


def test_audit_and_log_lines_name_a_peer_as_host_and_port():
    """What ``getpeername()`` gives for IPv4 and IPv6 sockets, as docs/security.md's audit lines show it."""
    assert peer_address(("127.0.0.1", 46646)) == "127.0.0.1:46646"
    assert peer_address(("::1", 50412, 0, 0)) == "[::1]:50412"
