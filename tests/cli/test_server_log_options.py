"""The log and monitoring-port flags of gms-nameserver and gms-broker on real processes: json
lines (also from GMS_*_LOG_FORMAT) naming a failed request by its id and peer, a log file rotated
by size, the metrics port published in its own file."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from processes import BrokerProcess, NameserverProcess, wait_until
from scrape import get

from gms.logging_setup import JsonFormatter, RepeatedWarningFilter
from gms.protocol.codes import Flag, RequestCode
from gms.protocol.frame import encode_frame

pytestmark = pytest.mark.timeout(60)

REQUEST_ID = 4711


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a json log, parsed (a line that is no JSON object fails the test)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(isinstance(line, dict) for line in lines)
    return lines


def test_json_log_names_a_failed_request_by_id_and_peer(tmp_path, monkeypatch):
    monkeypatch.setenv("GMS_NAMESERVER_LOG_FORMAT", "json")  # what gms standalone's children inherit
    log_file = tmp_path / "ns.json.log"
    ns = NameserverProcess(tmp_path / "ns", args=["--log-file", str(log_file)]).start()
    try:
        with socket.create_connection(("127.0.0.1", ns.port), timeout=10) as sock:
            parts = encode_frame(RequestCode.GET_ROUTE, REQUEST_ID, flags=Flag.ONEWAY, fields={"topic": "nowhere"})
            sock.sendall(b"".join(parts))
            client_port = sock.getsockname()[1]

            def failed() -> list[dict[str, Any]]:
                return [line for line in json_lines(log_file) if line.get("request_id") == REQUEST_ID]

            wait_until(failed, 10)  # the connection stays open: closing it would cancel the request
    finally:
        ns.stop()
    [line] = failed()
    assert line["level"] == "WARNING"
    assert line["logger"] == "gms.net.server"
    assert line["code"] == RequestCode.GET_ROUTE
    assert line["peer"] == f"127.0.0.1:{client_port}"
    assert f"(request {REQUEST_ID} from 127.0.0.1:{client_port}): topic nowhere does not exist" in line["message"]
    lines = json_lines(log_file)
    assert {"time", "level", "logger", "message"} <= lines[0].keys()
    assert any("nameserver stopped cleanly" in line["message"] for line in lines)


def test_json_formatter_keeps_the_exception_and_extra_fields():
    try:
        raise RuntimeError("a handler bug")
    except RuntimeError:
        record = logging.getLogger("gms.net.server").makeRecord(
            "gms.net.server", logging.ERROR, __file__, 1, "request %(request_id)d failed", ({"request_id": 7},),
            sys.exc_info(), extra={"request_id": 7})
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "request 7 failed"
    assert line["request_id"] == 7
    assert line["level"] == "ERROR"
    assert line["exception"].startswith("Traceback") and "RuntimeError: a handler bug" in line["exception"]
    assert line["time"].endswith("+00:00")


def test_log_file_rotates_past_its_size(tmp_path):
    log_file = tmp_path / "broker.log"
    size_max = 200  # the broker's start and stop lines fill several such files
    broker = BrokerProcess(tmp_path / "b", ["--log-file", str(log_file), "--log-file-max-bytes", str(size_max),
                                            "--log-file-backups", "2"]).start()
    broker.stop()
    files = sorted(tmp_path.glob("broker.log*"))
    assert [f.name for f in files] == ["broker.log", "broker.log.1", "broker.log.2"]
    for f in files:
        text = f.read_text()
        assert len(text.encode()) <= size_max or text.count("\n") == 1, f"{f.name}: {text!r}"
    assert "broker stopped cleanly" in log_file.read_text()
    assert broker.log_tail() == ""  # nothing went to stderr


def test_metrics_port_file(tmp_path):
    port_file = tmp_path / "metrics.port"
    broker = BrokerProcess(tmp_path / "b", ["--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                                            str(port_file)]).start()
    try:
        wait_until(port_file.exists, 5)  # written right after the main port file
        port = int(port_file.read_text())
        assert port != broker.port
        assert get(port, "/healthz") == (200, "ok\n")
    finally:
        broker.stop()


@pytest.mark.parametrize("module", ["gms.broker", "gms.nameserver"])
@pytest.mark.parametrize("flag, path, error", [
    ("--metrics-port-file", "metrics.port", "--metrics-port-file needs --metrics-listen"),
    ("--log-file", "missing/server.log", "cannot open --log-file"),
])
def test_bad_log_and_metrics_flags_are_usage_errors(tmp_path, module, flag, path, error):
    run = subprocess.run([sys.executable, "-P", "-m", module, flag, str(tmp_path / path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert error in run.stderr and "Traceback" not in run.stderr


def test_the_audit_trail_is_never_throttled():
    """Every refused request stays a line of its own; other warnings repeat once a minute."""
    throttle = RepeatedWarningFilter()

    def record(name: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, "refused request code %d", (200,), None)
    assert [throttle.filter(record("gms.audit")) for _ in range(3)] == [True] * 3
    assert [throttle.filter(record("gms.net.server")) for _ in range(3)] == [True, False, False]
