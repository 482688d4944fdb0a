"""A secured nameserver that embeds its etcd secures that etcd too (TLS with the nameserver's
certificate, authentication as the configured etcd user); brokers reach it with the same etcd
credentials and register over TLS as themselves."""

from __future__ import annotations

import time

import pytest
from processes import BrokerProcess, NameserverProcess

from gms.client import Admin, Producer
from gms.cluster.errors import ClusterError
from gms.cluster.etcd_client import EtcdAuth, EtcdClient
from gms.cluster.metadata import ClusterMetadata
from gms.security.client import ClientSecurity
from gms.security.devca import ensure_dev_pki
from gms.security.scram import Credential
from gms.security.tls import TlsFiles
from gms.security.users import User

pytestmark = pytest.mark.timeout(120)


def test_embedded_etcd_of_a_secured_nameserver_is_secured(tmp_path):
    pki = ensure_dev_pki(tmp_path / "pki")
    tls = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-ca", str(pki.ca_cert)]
    etcd = ["--etcd-user", "gms", "--etcd-password", "etcd-pw"]
    ns = NameserverProcess(tmp_path / "ns", None, [*tls, "--authentication", *etcd])
    ns.start()
    broker = None
    try:
        status_etcd = _etcd_endpoint(ns)
        for auth in (None, EtcdAuth(ca=str(pki.ca_cert)), EtcdAuth("gms", "wrong", str(pki.ca_cert))):
            with pytest.raises(ClusterError), EtcdClient(status_etcd, auth=auth, timeout_s=3) as client:
                client.get("/gms/topics/")
        with EtcdClient(status_etcd, auth=EtcdAuth("gms", "etcd-pw", str(pki.ca_cert))) as client:
            metadata = ClusterMetadata(client)
            metadata.put_user(User("root", "super", Credential.for_password("root-pw")))
            metadata.put_user(User("brk", "broker", Credential.for_password("brk-pw")))
        broker = BrokerProcess(tmp_path / "broker", ["--nameserver", ns.address, *tls, "--authentication", *etcd,
                                                     "--etcd-ca", str(pki.ca_cert), "--user", "brk",
                                                     "--password", "brk-pw"])
        broker.start()
        security = ClientSecurity(TlsFiles(str(pki.ca_cert)), "root", "root-pw")
        with Admin(nameserver=ns.address, security=security) as admin:
            deadline = time.monotonic() + 20
            while not admin.brokers():
                assert time.monotonic() < deadline, broker.log_tail()
                time.sleep(0.1)
            admin.create_topic("emb", queues=1)
        with Producer(nameserver=ns.address, security=security) as producer:
            assert producer.send("emb", b"x").queue_offset == 0
    finally:
        if broker is not None:
            broker.stop()
        ns.stop()


def _etcd_endpoint(ns: NameserverProcess) -> str:
    """The embedded etcd's endpoint, from the nameserver's log line."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in ns.log_path.read_text().splitlines():
            if "embedded etcd on " in line:
                return line.split("embedded etcd on ", 1)[1].split()[0]
        time.sleep(0.1)
    raise AssertionError(ns.log_tail())
