"""Servers of the RocketMQ API on free ports: a lone broker (no nameserver), and a `gms standalone`
(embedded etcd, nameserver, broker) for the modules that need a nameserver (group and topic
settings, the CLI)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli_standalone import running_standalone
from tests.processes import BrokerProcess, wait_until


def rocketmq_broker(root: Path, *args: str) -> Iterator[BrokerProcess]:
    """A broker without a nameserver serving the RocketMQ API on a free port (``.rocketmq``),
    for a fixture to yield from."""
    port_file = root / "rocketmq.port"
    proc = BrokerProcess(root / "broker", [*args, "--rocketmq-listen", "127.0.0.1:0",
                                           "--rocketmq-port-file", str(port_file)])
    proc.start()
    try:
        wait_until(port_file.exists, 10)
        proc.rocketmq = f"127.0.0.1:{int(port_file.read_text())}"
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker without a nameserver; ``broker.rocketmq``: its RocketMQ endpoint."""
    yield from rocketmq_broker(tmp_path_factory.mktemp("rmq"))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The banner's addresses of a running `gms standalone` (the broker registered)."""
    yield from running_standalone(tmp_path_factory.mktemp("sa"))


@pytest.fixture
def gms(standalone):
    """Run ``gms ARGS --nameserver <the standalone's>``; the completed process (text)."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args, "--nameserver", standalone["nameserver"]],
                              capture_output=True, text=True, timeout=60, check=False)
    return run
