"""The [security] settings: checked before anything starts, from flags, variables and TOML alike."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gms.broker.config import load_config
from gms.security.config import SecurityConfig
from gms.security.devca import ensure_dev_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return ensure_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("settings, complaint", [
    ({"acl": True}, "acl needs authentication"),
    ({"tls_client_auth": True}, "tls_client_auth needs"),
    ({"user": "broker"}, "user and password together"),
    ({"etcd_password": "x"}, "etcd_user and etcd_password"),
    ({"tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent-key.pem"}, "does not exist"),
])
def test_inconsistent_settings_are_refused_with_what_to_do(settings, complaint):
    with pytest.raises(ValueError, match=complaint):
        SecurityConfig(**settings)


def test_the_broker_reads_a_security_table(tmp_path, pki):
    toml = tmp_path / "broker.toml"
    toml.write_text(f"""
[broker]
nameserver = "127.0.0.1:1"
[security]
tls_cert = "{pki.server_cert}"
tls_key = "{pki.server_key}"
tls_ca = "{pki.ca_cert}"
authentication = true
acl = true
super_users = ["ops", "root"]
""")
    config = load_config(toml, {}, {}, {"super_users": "ops"})
    assert config.security.tls and config.security.acl
    assert config.security.super_users == ("ops",)  # the flag overrides the file
    assert config.security.listener_context() is not None
    outgoing = config.security.outgoing("broker:b1", "pw")
    assert outgoing.tls is not None and outgoing.username == "broker:b1"


def test_authentication_needs_a_nameserver(tmp_path):
    with pytest.raises(ValueError, match="needs a cluster"):
        load_config(None, {"store_dir": tmp_path}, {}, {"authentication": True})


@pytest.mark.parametrize("module, args", [
    ("gms.broker", ["--authentication", "--store-dir", "{tmp}"]),
    ("gms.nameserver", ["--acl", "--etcd", "127.0.0.1:1"]),
    ("gms.nameserver", ["--authentication", "--data-dir", "{tmp}"]),  # its embedded etcd would be open
])
def test_servers_refuse_inconsistent_flags_before_starting(tmp_path, module, args):
    argv = [a.format(tmp=tmp_path) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GMS_")}
    done = subprocess.run([sys.executable, "-P", "-m", module, *argv], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "needs" in done.stderr or "secures its embedded etcd" in done.stderr
