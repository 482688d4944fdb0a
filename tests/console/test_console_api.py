"""The console's API answers JSON, errors included, that says what to do: with the nameserver
down, for things that do not exist, and for malformed requests; pages show those messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_data import ClusterData
from console_helpers import Browser, ConsoleProcess
from processes import free_port

from gms.msgid import encode_msg_id

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def orphan_console(tmp_path) -> Iterator[tuple[ConsoleProcess, str]]:
    """A console whose nameserver does not exist (nothing listens on its port)."""
    nameserver = f"127.0.0.1:{free_port()}"
    process = ConsoleProcess(tmp_path / "console", nameserver)
    try:
        yield process, nameserver
    finally:
        assert process.stop() == 0, process.log_tail()
    assert "Traceback" not in process.log_tail(), process.log_tail()


def test_api_answers_json_errors_when_the_nameserver_is_down(orphan_console: tuple[ConsoleProcess, str]) -> None:
    console, nameserver = orphan_console
    status, config = console.get("/api/config")
    assert status == 200 and (config["nameserver"], config["admin"]) == (nameserver, False)
    for path in ("/api/cluster", "/api/topics", "/api/topics/orders", "/api/groups", "/api/groups/billing"):
        status, answer = console.get(path)
        assert (status, answer["kind"]) == (503, "NameserversUnavailableError"), (path, answer)
        assert answer["error"].startswith(f"no nameserver at {nameserver} answers: start the cluster")
    status, answer = console.get("/api/nothing-here")
    assert status == 404 and "docs/console.md" in answer["error"]


def test_pages_say_the_nameserver_is_down(page: Browser, orphan_console: tuple[ConsoleProcess, str]) -> None:
    console, nameserver = orphan_console
    page.open(console.url("/"), state="error")
    assert page.text("#status .error").startswith(f"no nameserver at {nameserver} answers")
    page.screenshot("cluster-nameserver-down")


def test_unknown_topic_group_and_message(console: ConsoleProcess, data: ClusterData) -> None:
    status, answer = console.get("/api/topics/no-such-topic")
    assert (status, answer["kind"]) == (404, "TopicNotFoundError") and "no-such-topic" in answer["error"]
    status, answer = console.get("/api/groups/nobody")
    assert (status, answer["kind"]) == (404, "GroupNotFoundError")
    assert "no broker knows group 'nobody'" in answer["error"]
    status, answer = console.get("/api/messages/xyz")
    assert status == 400 and "is not hexadecimal" in answer["error"] and "gms produce" in answer["error"]
    dead_broker = encode_msg_id("127.0.0.1", free_port(), 0)  # a broker that does not run
    status, answer = console.get(f"/api/messages/{dead_broker}")
    assert status == 503 and "is the broker running?" in answer["error"]


def test_unknown_group_page_explains(page: Browser, console: ConsoleProcess) -> None:
    page.open(console.url("/groups/nobody"), state="error")
    assert "a group is known once a consumer of it joins or commits" in page.text("#status .error")
    page.open(console.url("/no/such/page"), state="error")
    assert "use the links above" in page.text("main")



def test_requests_to_other_host_names_are_refused(console: ConsoleProcess, admin_console: ConsoleProcess) -> None:
    """A page of a domain that resolves to the console's address (DNS rebinding) reads nothing."""
    for path in ("/api/cluster", "/"):
        status, answer = console.get(path, {"Host": f"rebound.example:{console.port}"})
        assert (status, answer["kind"]) == (403, "HostRefused")
        assert "restart it with --allow-host rebound.example" in answer["error"]
    for host in ("localhost", "127.0.0.1"):
        assert console.get("/api/config", {"Host": f"{host}:{console.port}"})[0] == 200
    assert admin_console.get("/api/config", {"Host": "Console.Example"})[0] == 200  # --allow-host console.example
