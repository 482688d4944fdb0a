"""etcd with authentication and TLS: the embedded etcd's users, role and TLS, and EtcdClient's
credentials, token renewal and clear refusals. Real etcd processes, a development PKI."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from processes import wait_until  # tests/ is on sys.path (rootdir conftest)

from gms.cluster.errors import EmbeddedEtcdError, EtcdAuthFailed, EtcdUnavailable
from gms.cluster.etcd_client import EtcdAuth, EtcdClient, KeyMissing, Put, WatchBatch
from gms.nameserver.embedded_etcd import EmbeddedEtcd, EmbeddedEtcdAuth
from gms.security.devca import DevPki, ensure_dev_pki
from gms.security.tls import TlsFiles

HOSTS = ["127.0.0.1", "localhost"]
PREFIX = "/gms/"
AUTH = EmbeddedEtcdAuth(root_password="root-secret", user="gms", password="gms-secret", prefix=PREFIX)
TOKEN_TTL_S = 2
# etcd drops an unused token within a second after its TTL.
IDLE_S = TOKEN_TTL_S + 2
TIMEOUT_S = 2.0


class Changes:
    """A watch callback that keeps the keys it saw put or deleted, and how the watch ended."""

    def __init__(self) -> None:
        self.puts: list[bytes] = []
        self.deletes: list[bytes] = []
        self.ended: Exception | None = None
        self._lock = threading.Lock()

    def __call__(self, resp: WatchBatch | Exception) -> None:
        with self._lock:
            if isinstance(resp, Exception):
                self.ended = resp
                return
            for event in resp.events:
                (self.deletes if event.deleted else self.puts).append(event.kv.key)

    def saw_put(self, key: str) -> bool:
        with self._lock:
            return key.encode() in self.puts

    def saw_delete(self, key: str) -> bool:
        with self._lock:
            return key.encode() in self.deletes


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return ensure_dev_pki(tmp_path_factory.mktemp("pki"), hosts=HOSTS)


def tls_files(pki: DevPki) -> TlsFiles:
    return TlsFiles(str(pki.ca_cert), str(pki.server_cert), str(pki.server_key))


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    """Authentication on, plaintext, tokens that expire after TOKEN_TTL_S unused."""
    with EmbeddedEtcd(tmp_path_factory.mktemp("etcd-auth"), auth=AUTH, auth_token_ttl_s=TOKEN_TTL_S) as etcd:
        yield etcd


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: DevPki) -> Iterator[EmbeddedEtcd]:
    """TLS and authentication on."""
    with EmbeddedEtcd(tmp_path_factory.mktemp("etcd-tls"), tls=tls_files(pki), auth=AUTH) as etcd:
        yield etcd


# -- configuration values ------------------------------------------------------------------------


def test_etcd_auth_hides_the_password_and_checks_its_fields(pki):
    auth = EtcdAuth(user="gms", password="s3cret", ca=str(pki.ca_cert))
    assert auth.tls and "s3cret" not in repr(auth)
    assert not EtcdAuth(user="gms", password="x").tls
    with pytest.raises(ValueError, match="user"):
        EtcdAuth(password="x")
    with pytest.raises(ValueError, match="key"):
        EtcdAuth(ca=str(pki.ca_cert), cert=str(pki.client_cert))
    with pytest.raises(ValueError, match="CA"):
        EtcdAuth(cert=str(pki.client_cert), key=str(pki.client_key))
    with pytest.raises(EtcdAuthFailed, match="CA file"):
        EtcdClient("127.0.0.1:1", auth=EtcdAuth(ca=str(pki.ca_cert) + ".missing"))


def test_embedded_etcd_auth_checks_its_fields(tmp_path, pki):
    assert "root-secret" not in repr(AUTH) and "gms-secret" not in repr(AUTH)
    with pytest.raises(ValueError, match="password"):
        EmbeddedEtcdAuth(root_password="", password="x")
    with pytest.raises(ValueError, match="other than 'root'"):
        EmbeddedEtcdAuth(root_password="r", user="root", password="x")
    with pytest.raises(ValueError, match="prefix"):
        EmbeddedEtcdAuth(root_password="r", password="x", prefix="")
    with pytest.raises(ValueError, match="CA"):
        EmbeddedEtcd(tmp_path, tls=TlsFiles(cert=str(pki.server_cert), key=str(pki.server_key)))


# -- authentication ------------------------------------------------------------------------------


def test_client_without_credentials_is_refused(auth_etcd):
    with EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S) as client:
        for call in (
            lambda: client.get(PREFIX + "k"),
            lambda: client.put(PREFIX + "k", b"v"),
            lambda: client.watch_prefix(PREFIX, 0, Changes()),
        ):
            with pytest.raises(EtcdAuthFailed, match="has no etcd user; configure the etcd user and password"):
                call()
        assert client.status().version  # etcd's status needs no user


@pytest.mark.parametrize("user", ["gms", "nobody"])
def test_wrong_password_is_refused(auth_etcd, user):
    auth = EtcdAuth(user=user, password="wrong")
    refused = rf"refused user '{user}': wrong user name or password.*check the"
    with (
        EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth) as client,
        pytest.raises(EtcdAuthFailed, match=refused),
    ):
        client.get(PREFIX + "k")


def test_gms_user_reads_writes_watches_and_leases_under_its_prefix(auth_etcd):
    key = PREFIX + "rw/a"
    with EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth_etcd.client_auth) as client:
        changes = Changes()
        watch_id = client.watch_prefix(PREFIX + "rw/", 0, changes)
        lease_id = client.grant_lease(10)
        assert client.txn([KeyMissing(key)], [Put(key, b"1", lease_id)])
        assert client.get(key).value == b"1"
        assert [kv.key for kv in client.get_prefix(PREFIX + "rw/").kvs] == [key.encode()]
        assert client.refresh_lease(lease_id) > 0
        client.revoke_lease(lease_id)
        assert client.get(key) is None
        wait_until(lambda: changes.saw_put(key) and changes.saw_delete(key), 2.0)
        client.cancel_watch(watch_id)
        assert changes.ended is None


def test_gms_user_is_refused_outside_its_prefix(auth_etcd):
    with EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth_etcd.client_auth) as client:
        for call in (
            lambda: client.put("/other/k", b"v"),
            lambda: client.get("/other/k"),
            lambda: client.get_prefix("/"),
            lambda: client.watch_prefix("/other/", 0, Changes()),
        ):
            with pytest.raises(EtcdAuthFailed, match=r"denied user 'gms' access.*role grants read-write"):
                call()
        client.put(PREFIX + "still-fine", b"v")  # a refusal leaves the client usable


@pytest.mark.timeout(60)
def test_idle_client_outlives_its_token(auth_etcd, caplog):
    """An idle client's token expires; its next calls re-authenticate transparently, a watch made
    before keeps delivering, a new one is made, the lease is kept alive."""
    caplog.set_level(logging.DEBUG, logger="gms.cluster.etcd_client")
    with EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth_etcd.client_auth) as client:
        before = Changes()
        client.watch_prefix(PREFIX + "idle/", 0, before)
        lease_id = client.grant_lease(30)
        client.put(PREFIX + "idle/first", b"1", lease_id=lease_id)
        wait_until(lambda: before.saw_put(PREFIX + "idle/first"), 2.0)
        caplog.clear()

        time.sleep(IDLE_S)
        after = Changes()
        client.watch_prefix(PREFIX + "idle/", 0, after)  # first call after the idle time
        assert "refused the token of user gms" in caplog.text
        assert client.refresh_lease(lease_id) > 0
        client.put(PREFIX + "idle/second", b"2")
        wait_until(lambda: before.saw_put(PREFIX + "idle/second") and after.saw_put(PREFIX + "idle/second"), 2.0)

        time.sleep(IDLE_S)  # again, with threads racing to re-authenticate: one of them does
        caplog.clear()
        with ThreadPoolExecutor(4) as pool:
            values = list(pool.map(lambda _: client.get(PREFIX + "idle/second").value, range(8)))
        assert values == [b"2"] * 8
        assert caplog.text.count("authenticated as gms") == 1
        assert client.refresh_lease(lease_id) > 0
        assert before.ended is None and after.ended is None


@pytest.mark.timeout(90)
def test_restart_on_the_same_data_dir_with_auth_on(tmp_path):
    data_dir = tmp_path / "etcd"
    with EmbeddedEtcd(data_dir, auth=AUTH) as etcd:
        endpoint = etcd.endpoint
        with EtcdClient(etcd.endpoint, timeout_s=TIMEOUT_S, auth=etcd.client_auth) as client:
            client.put(PREFIX + "kept", b"v")
    with EmbeddedEtcd(data_dir, auth=AUTH) as etcd:  # auth already on: set-up logs in as root
        assert etcd.endpoint == endpoint
        with EtcdClient(etcd.endpoint, timeout_s=TIMEOUT_S, auth=etcd.client_auth) as client:
            assert client.get(PREFIX + "kept").value == b"v"
    moved = EmbeddedEtcdAuth(root_password=AUTH.root_password, password="new-secret", prefix="/gms2/")
    with EmbeddedEtcd(data_dir, auth=moved) as etcd:  # the gms user is put back to what is configured
        with EtcdClient(etcd.endpoint, timeout_s=TIMEOUT_S, auth=etcd.client_auth) as client:
            client.put("/gms2/k", b"v")
            with pytest.raises(EtcdAuthFailed, match="denied"):
                client.get(PREFIX + "kept")
        old_password = EtcdAuth(user="gms", password=AUTH.password)
        with (
            EtcdClient(etcd.endpoint, timeout_s=TIMEOUT_S, auth=old_password) as client,
            pytest.raises(EtcdAuthFailed, match="wrong user name or password"),
        ):
            client.get("/gms2/k")
    wrong_root = EmbeddedEtcdAuth(root_password="not-it", password="x")
    with pytest.raises(EmbeddedEtcdError, match="give the root password of that run"):
        EmbeddedEtcd(data_dir, auth=wrong_root).start()


# -- TLS -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", HOSTS)
def test_client_with_the_ca_connects_over_tls(tls_etcd, host):
    endpoint = tls_etcd.endpoint.replace("127.0.0.1", host)
    with EtcdClient(endpoint, timeout_s=TIMEOUT_S, auth=tls_etcd.client_auth) as client:
        changes = Changes()
        client.watch_prefix(PREFIX + "tls/", 0, changes)
        client.put(PREFIX + "tls/" + host, b"v")
        assert client.get(PREFIX + "tls/" + host).value == b"v"
        wait_until(lambda: changes.saw_put(PREFIX + "tls/" + host), 2.0)
        with pytest.raises(EtcdAuthFailed, match="denied"):
            client.put("/other", b"v")


def test_plaintext_client_to_tls_etcd_fails_clearly(tls_etcd):
    auth = EtcdAuth(user=AUTH.user, password=AUTH.password)
    with (
        EtcdClient(tls_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth) as client,
        pytest.raises(EtcdUnavailable, match=r"serves TLS.*configure the etcd CA file"),
    ):
        client.get(PREFIX + "k")


def test_client_trusting_another_ca_fails_clearly(tls_etcd, tmp_path):
    other = ensure_dev_pki(tmp_path / "other", hosts=HOSTS)
    auth = EtcdAuth(user=AUTH.user, password=AUTH.password, ca=str(other.ca_cert))
    with (
        EtcdClient(tls_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth) as client,
        pytest.raises(EtcdAuthFailed, match=rf"TLS with etcd .* failed .*CA file {other.ca_cert}"),
    ):
        client.get(PREFIX + "k")


def test_tls_client_to_plaintext_etcd_fails_clearly(auth_etcd, pki):
    auth = EtcdAuth(user=AUTH.user, password=AUTH.password, ca=str(pki.ca_cert))
    with (
        EtcdClient(auth_etcd.endpoint, timeout_s=TIMEOUT_S, auth=auth) as client,
        pytest.raises(EtcdUnavailable, match=r"TLS handshake.*leave out the etcd CA file"),
    ):
        client.get(PREFIX + "k")


def test_tls_without_auth(tmp_path, pki):
    with EmbeddedEtcd(tmp_path / "etcd", tls=tls_files(pki)) as etcd:
        assert etcd.client_auth == EtcdAuth(ca=str(pki.ca_cert))
        with EtcdClient(etcd.endpoint, timeout_s=TIMEOUT_S, auth=etcd.client_auth) as client:
            client.put("/anywhere", b"v")
            assert client.get("/anywhere").value == b"v"


def test_embedded_etcd_refuses_a_ca_that_did_not_sign_its_certificate(tmp_path, pki):
    other = ensure_dev_pki(tmp_path / "other", hosts=HOSTS)
    tls = TlsFiles(str(other.ca_cert), str(pki.server_cert), str(pki.server_key))
    with pytest.raises(EmbeddedEtcdError, match="does not verify against the CA"):
        EmbeddedEtcd(tmp_path / "etcd", tls=tls).start()

