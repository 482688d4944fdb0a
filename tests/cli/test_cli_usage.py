"""The gms CLI's argument handling and error reporting (click's CliRunner, no servers): usage
errors exit 2, failed operations exit 1 with a message that says what to do, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from gms.cli.main import cli
from gms.client.display import body_text
from gms.nameserver.embedded_etcd import free_port

COMMANDS = [
    [], ["topic"], ["topic", "create"], ["topic", "update"], ["topic", "delete"], ["topic", "list"],
    ["topic", "describe"], ["produce"], ["tail"], ["group"], ["group", "list"], ["group", "describe"],
    ["group", "reset-offsets"], ["group", "delete"], ["group", "create"], ["group", "config"],
    ["cluster"], ["msg"], ["msg", "show"], ["standalone"],
]


def run(*args: str, env: dict[str, str] | None = None, input: bytes | None = None):
    return CliRunner().invoke(cli, list(args), env=env, input=input, prog_name="gms")


@pytest.fixture
def dead_nameserver() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command):
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage: gms" in result.output


@pytest.mark.parametrize("command", [
    ["topic", "list"], ["topic", "create", "t"], ["topic", "describe", "t"], ["topic", "delete", "-y", "t"],
    ["produce", "t", "hello"], ["tail", "t"], ["group", "list"], ["group", "describe", "g"], ["cluster"],
    ["group", "reset-offsets", "g", "-t", "t", "--to-earliest"], ["group", "delete", "-y", "g"],
], ids=" ".join)
def test_no_nameserver_says_how_to_start_one(command, dead_nameserver):
    result = run(*command, "--nameserver", dead_nameserver)
    assert result.exit_code == 1, result.output
    assert f"no nameserver at {dead_nameserver}" in result.stderr
    assert "gms standalone" in result.stderr
    assert "Traceback" not in result.output


def test_nameserver_comes_from_the_environment(dead_nameserver):
    result = run("topic", "list", env={"GMS_NAMESERVER": dead_nameserver})
    assert result.exit_code == 1 and f"no nameserver at {dead_nameserver}" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["topic", "list", "--nameserver", "nohost"], "is not host:port"),
    (["topic", "create", "t", "--queues", "0"], "1<=x<=1024"),
    (["topic", "update", "t"], "nothing to update"),
    (["produce", "t", "a", "--file", __file__], "not both"),
    (["produce", "t", "a", "--property", "novalue"], "is not k=v"),
    (["tail", "t", "--from", "yesterday"], "not first or last, and 'yesterday' is neither"),
    (["tail", "t", "--count", "0"], "x>=1"),
    (["tail", "t", "--format", "xml"], "'text', 'json'"),
    (["msg", "show", "zz"], "is not hexadecimal"),
    (["nosuch"], "No such command"),
])
def test_usage_errors_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["topic", "delete", "t"], ["group", "delete", "g"]], ids=" ".join)
def test_delete_asks_first(command, dead_nameserver):
    result = run(*command, "--nameserver", dead_nameserver, input=b"n\n")
    assert result.exit_code == 1 and "Aborted" in result.stderr  # nothing was asked of the cluster


@pytest.mark.parametrize("body, shown", [
    (b"hello world", "hello world"),
    ("héllo ✓".encode(), "héllo ✓"),
    (b"tab\tok", "tab\tok"),
    (b"\x00body\xff", "\\x00body\\xff"),
    (b"line\nbreak", "line\\nbreak"),
    (b"\x1b[31mred", "\\x1b[31mred"),
])
def test_bodies_text_or_escaped(body, shown):
    assert body_text(body) == shown


def test_python_dash_m_works():
    result = subprocess.run([sys.executable, "-P", "-m", "gms.cli", "--version"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0 and "gms, version" in result.stdout
