"""`gms standalone --secure` end to end through the `gms` command: its banner tells clients what
to export, anonymous clients are refused, the admin manages users and ACLs, a user gets exactly
what it was granted, and the generated secrets are private files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from processes import FREE_MONITORING_PORTS

from gms.cluster.errors import ClusterError
from gms.cluster.etcd_client import EtcdAuth, EtcdClient

pytestmark = pytest.mark.timeout(180)
START_TIMEOUT_S = 60


def gms(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GMS_")}
    return subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    data = tmp_path_factory.mktemp("secure") / "data"
    proc = subprocess.Popen([sys.executable, "-P", "-m", "gms.cli", "standalone", "--secure", "--data-dir", str(data),
                             "--nameserver-port", "0", "--broker-port", "0", *FREE_MONITORING_PORTS,
                             "--commitlog-file-size", str(32 << 20)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = ""
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    while "clients" not in banner and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        banner += line
    try:
        nameserver = re.search(r"nameserver\s+(\S+)", banner)
        ca = re.search(r"GMS_TLS_CA=(\S+)", banner)
        password_file = re.search(r"GMS_PASSWORD=\$\(cat (\S+)\)", banner)
        assert nameserver and ca and password_file, banner
        admin_env = {"GMS_NAMESERVER": nameserver.group(1), "GMS_TLS_CA": ca.group(1), "GMS_USER": "admin",
                     "GMS_PASSWORD": Path(password_file.group(1)).read_text().strip()}
        etcd = re.search(r"etcd\s+(\S+)", banner)
        assert etcd, banner
        admin_env["etcd"] = etcd.group(1)
        kafka = re.search(r"kafka\s+(\S+)\s+\(SASL_SSL", banner)
        assert kafka, banner
        admin_env["kafka"] = kafka.group(1)
        yield data, admin_env
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_anonymous_and_plaintext_clients_are_refused(secure):
    data, admin = secure
    admin = dict(admin)
    etcd = admin.pop("etcd")
    for auth in (None, EtcdAuth(ca=str(data / "tls" / "ca.pem"))):  # plaintext; TLS without etcd credentials
        with pytest.raises(ClusterError), EtcdClient(etcd, auth=auth, timeout_s=3) as client:
            client.get("/gms/brokers/")
    anonymous = gms("topic", "list", env={"GMS_NAMESERVER": admin["GMS_NAMESERVER"], "GMS_TLS_CA": admin["GMS_TLS_CA"]})
    assert anonymous.returncode == 1 and "authenticate" in anonymous.stderr, anonymous.stderr
    plaintext = gms("topic", "list", env={"GMS_NAMESERVER": admin["GMS_NAMESERVER"], "GMS_USER": "admin",
                                          "GMS_PASSWORD": admin["GMS_PASSWORD"]})
    assert plaintext.returncode == 1, plaintext.stdout


def test_admin_manages_users_and_acls_and_a_user_gets_what_it_is_granted(secure):
    _, admin = secure
    admin = {k: v for k, v in admin.items() if k != "etcd"}
    assert gms("topic", "create", "orders", "--queues", "2", env=admin).returncode == 0
    added = gms("user", "add", "alice", "--new-password", "alice-pw", env=admin)
    assert added.returncode == 0, added.stderr
    users = json.loads(gms("user", "list", "--json", env=admin).stdout)
    assert {"name": "alice", "role": "normal"} in users and {"name": "admin", "role": "super"} in users
    alice = {**admin, "GMS_USER": "alice", "GMS_PASSWORD": "alice-pw"}

    refused = gms("produce", "orders", "hello", env=alice)
    assert refused.returncode == 1 and "normal:alice may not " in refused.stderr, refused.stderr
    assert gms("acl", "add", "-p", "alice", "--topic", "orders", "-o", "publish", env=admin).returncode == 0
    rules = json.loads(gms("acl", "list", "--json", env=admin).stdout)
    assert {"principal": "alice", "resource_type": "topic", "pattern": "orders", "operation": "publish",
            "pattern_type": "literal", "permission": "allow"} in rules
    sent = gms("produce", "orders", "hello", env=alice)
    assert sent.returncode == 0, sent.stderr
    tail = gms("tail", "orders", "--count", "1", env=alice)
    assert tail.returncode == 1 and "normal:alice may not " in tail.stderr, tail.stderr  # no subscribe grant
    assert gms("acl", "add", "-p", "alice", "--topic", "orders", "-o", "subscribe", env=admin).returncode == 0
    # `gms tail` without --group reads as a broadcasting group named gms-tail-<pid>-<random>
    assert gms("acl", "add", "-p", "alice", "--group", "gms-tail-", "--prefix", "-o", "subscribe",
               env=admin).returncode == 0
    tail = gms("tail", "orders", "--count", "1", env=alice)
    assert tail.returncode == 0 and "hello" in tail.stdout, tail.stderr

    not_super = gms("user", "add", "mallory", "--role", "super", "--new-password", "x", env=alice)
    assert not_super.returncode == 1 and "super" in not_super.stderr
    assert gms("user", "delete", "alice", env=admin).returncode == 0
    gone = gms("topic", "list", env=alice)
    assert gone.returncode == 1 and "authenticat" in gone.stderr


def test_kafka_clients_authenticate_over_tls(secure):
    _, admin = secure
    conf = {"bootstrap.servers": admin["kafka"], "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "admin", "sasl.password": admin["GMS_PASSWORD"], "ssl.ca.location": admin["GMS_TLS_CA"]}
    env = {k: v for k, v in admin.items() if k not in ("etcd", "kafka")}
    assert gms("topic", "create", "kafka-secure", "--queues", "1", env=env).returncode == 0
    delivered: list[object] = []
    producer = Producer(conf)
    producer.produce("kafka-secure", value=b"over TLS", on_delivery=lambda err, _: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = Consumer({**conf, "group.id": "kafka-secure", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["kafka-secure"])
        message = None
        deadline = time.monotonic() + 30
        while (message is None or message.error() is not None) and time.monotonic() < deadline:
            message = consumer.poll(1)
        assert message is not None and message.value() == b"over TLS"
    finally:
        consumer.close()


def test_secrets_and_certificates_are_private(secure):
    data, _ = secure
    for directory in (data / "secrets", data / "tls"):
        assert directory.stat().st_mode & 0o777 == 0o700
        for path in directory.iterdir():
            assert path.stat().st_mode & 0o777 == 0o600, path


def test_the_first_super_user_can_be_written_straight_into_etcd(secure):
    data, env = secure
    admin = {k: v for k, v in env.items() if k != "etcd"}
    etcd_password = (data / "secrets" / "etcd-gms.password").read_text().strip()
    anonymous_etcd = gms("user", "add", "ops", "--role", "super", "--new-password", "ops-pw", "--etcd", env["etcd"],
                         "--etcd-ca", str(data / "tls" / "ca.pem"))
    assert anonymous_etcd.returncode == 1, anonymous_etcd.stderr
    added = gms("user", "add", "ops", "--role", "super", "--new-password", "ops-pw", "--etcd", env["etcd"],
                "--etcd-user", "gms", "--etcd-ca", str(data / "tls" / "ca.pem"),
                env={"GMS_ETCD_PASSWORD": etcd_password})
    assert added.returncode == 0, added.stderr
    ops = {**admin, "GMS_USER": "ops", "GMS_PASSWORD": "ops-pw"}
    listed = gms("user", "list", "--json", env=ops)
    assert listed.returncode == 0 and {"name": "ops", "role": "super"} in json.loads(listed.stdout), listed.stderr
