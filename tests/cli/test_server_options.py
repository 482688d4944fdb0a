"""Server options from GMS_* environment variables, with flag > variable > config file > default,
and --version on every server command."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from processes import BrokerProcess, NameserverProcess

from gms import __version__
from gms.cli.main import cli
from gms.net import Connection, run
from gms.protocol.codes import RequestCode as C


def request(port: int, code: int, fields: dict | None = None) -> dict:
    async def main() -> dict:
        conn = await Connection.open("127.0.0.1", port)
        try:
            return dict((await conn.request(code, fields or {})).fields)
        finally:
            conn.close()

    return run(main())


@pytest.mark.parametrize("module, program", [("gms.broker", "gms-broker"), ("gms.nameserver", "gms-nameserver"),
                                             ("gms.cli", "gms")])
def test_version(module, program):
    out = subprocess.run([sys.executable, "-P", "-m", module, "--version"], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == f"{program}, version {__version__}"


def test_broker_flag_beats_env_beats_config_file_beats_default(tmp_path, monkeypatch):
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nbroker_name = "file-name"\ndefault_queue_count = 3\n'
                      '[store]\nflush_mode = "async"\n')
    monkeypatch.setenv("GMS_BROKER_FLUSH", "sync")  # env over the file
    monkeypatch.setenv("GMS_BROKER_NAME", "env-name")  # the flag below wins over it
    monkeypatch.setenv("GMS_BROKER_AUTO_CREATE_TOPICS", "true")
    broker = BrokerProcess(tmp_path / "b", ["--config", str(config), "--name", "flag-name"]).start()
    try:
        status = request(broker.port, C.BROKER_STATUS)
        assert status["name"] == "flag-name"
        assert status["flush_mode"] == "sync"
        request(broker.port, C.CREATE_TOPIC, {"topic": "orders"})  # queues from the file, not 8
        assert len(request(broker.port, C.TOPIC_STATS, {"topic": "orders"})["queues"]) == 3
    finally:
        broker.stop()


def test_nameserver_options_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GMS_NAMESERVER_ADVERTISED_ADDRESS", "127.0.0.1:1")
    ns = NameserverProcess(tmp_path / "ns").start()
    try:
        status = request(ns.port, C.CLUSTER_STATUS)
        assert [n["address"] for n in status["nameservers"]] == ["127.0.0.1:1"]
    finally:
        ns.stop()


def test_standalone_options_from_env_and_shown_in_help(monkeypatch):
    monkeypatch.setenv("GMS_STANDALONE_BROKER_PORT", "20911")
    monkeypatch.setenv("GMS_STANDALONE_DATA_DIR", "/srv/gms")
    command = cli.commands["standalone"]
    with click.Context(cli) as parent:
        params = command.make_context("standalone", ["--data-dir", "/flag"], parent=parent).params
    assert params["broker_port"] == 20911 and str(params["data_dir"]) == "/flag"
    with click.Context(cli) as parent:
        shown = command.get_help(command.make_context("standalone", [], parent=parent))
    assert "GMS_STANDALONE_NAMESERVER_PORT" in shown
