"""The embedded etcd's data dir is private: etcd's own files, its log and the remembered ports
are 0600 in 0700 directories, whatever the umask; a looser dir from an older version is
tightened at start and etcd keeps its data."""

from __future__ import annotations

import logging
import os

from file_modes import modes, not_private, umask

from gms.cluster.etcd_client import EtcdClient
from gms.nameserver.embedded_etcd import EmbeddedEtcd


def test_embedded_etcd_data_dir_is_private_whatever_the_umask(tmp_path):
    data_dir = tmp_path / "nameserver" / "etcd"  # made by start, parents included
    with umask(0), EmbeddedEtcd(data_dir) as etcd, EtcdClient(etcd.endpoint) as client:
        client.put("/k", b"v")
    found = modes(tmp_path / "nameserver")
    assert {"etcd/etcd.log", "etcd/ports.json", "etcd/member-data/member/snap/db",
            "etcd/member-data/member/wal/"} <= set(found)
    assert not_private(tmp_path / "nameserver") == {}


def test_loose_etcd_data_dir_is_tightened_at_start(tmp_path, caplog):
    data_dir = tmp_path / "etcd"
    with EmbeddedEtcd(data_dir) as etcd, EtcdClient(etcd.endpoint) as client:
        client.put("/k", b"v")
    for directory, _, files in os.walk(data_dir):  # as an older version (or a careless copy) left it
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)
    with caplog.at_level(logging.WARNING, logger="gms.private_files"), \
            EmbeddedEtcd(data_dir) as etcd, EtcdClient(etcd.endpoint) as client:
        assert client.get("/k").value == b"v"
    assert len([r for r in caplog.records if r.name == "gms.private_files"]) == 1
    assert not_private(data_dir) == {}
