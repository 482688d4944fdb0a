"""The console's admin actions: refused by a read-only console (and by another site's page),
done from the pages of an --admin console, and the group's live members protected unless
forced."""

from __future__ import annotations

import pytest
from cluster_data import GROUP, SENT_PER_QUEUE, TOPIC, ClusterData
from console_helpers import Browser, ConsoleProcess

from gms.client import Admin, Consumer

pytestmark = pytest.mark.timeout(60)

IDLE_GROUP = "audit"  # committed offsets, no live member: offsets may be reset without force


def test_read_only_console_refuses_admin_actions(console: ConsoleProcess, data: ClusterData) -> None:
    for path, body in (("/api/topics", {"topic": "never-made"}),
                       (f"/api/groups/{GROUP}/reset-offsets", {"topic": TOPIC, "to": "earliest"})):
        status, answer = console.post(path, body)
        assert status == 403 and answer["kind"] == "AdminActionsOff"
        assert "gms console --admin" in answer["error"]
    with Admin(nameserver=data.nameserver) as admin:
        assert "never-made" not in admin.topics()


def test_read_only_pages_offer_no_admin_forms(page: Browser, console: ConsoleProcess) -> None:
    page.open(console.url("/topics"))
    assert page.text("#mode") == "read-only"
    assert page.js("return document.getElementById('create-topic')") is None
    page.open(console.url(f"/groups/{GROUP}"))
    assert page.js("return document.getElementById('reset-offsets')") is None
    assert "gms console --admin" in page.text("#read-only")


def test_admin_console_refuses_other_sites_and_bad_requests(admin_console: ConsoleProcess) -> None:
    status, answer = admin_console.post("/api/topics", {"topic": "x"},
                                        {"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert (status, answer["kind"]) == (403, "CrossSiteRequest")
    behind_tls_proxy = {"Content-Type": "application/json", "Origin": f"https://127.0.0.1:{admin_console.port}"}
    status, answer = admin_console.post("/api/topics", {"topic": "x", "queues": 0}, behind_tls_proxy)
    assert status == 400  # past the origin check, refused for its queue count
    status, answer = admin_console.post("/api/topics", b"topic=x",
                                        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and "Content-Type: application/json" in answer["error"]
    status, answer = admin_console.post("/api/topics", {"topic": "x", "queues": 0})
    assert status == 400 and "'queues' must be an integer from 1 to 1024" in answer["error"]
    status, answer = admin_console.post(f"/api/groups/{GROUP}/reset-offsets", {"topic": TOPIC, "to": "offset"})
    assert status == 400 and "must be an integer" in answer["error"]


def test_create_topic_from_the_topics_page(page: Browser, admin_console: ConsoleProcess, data: ClusterData) -> None:
    page.open(admin_console.url("/topics"))
    assert page.text("#mode") == "admin actions on"
    form = page.driver.find_element("id", "create-topic")
    form.find_element("name", "topic").send_keys("made-in-console")
    queues = form.find_element("name", "queues")
    queues.clear()
    queues.send_keys("3")
    form.find_element("css selector", "button").click()
    page.wait_for(lambda: page.js("return document.getElementById('create-result').dataset.state") == "done",
                  "the topic to be created")
    assert page.text("#create-result") == "created made-in-console with 3 queues"
    with Admin(nameserver=data.nameserver) as admin:
        assert admin.topics()["made-in-console"] == 3
    page.screenshot("admin-create-topic")
    form.find_element("css selector", "button").click()  # the same name again
    page.wait_for(lambda: page.js("return document.getElementById('create-result').dataset.state") == "error",
                  "the second create to fail")
    assert "made-in-console" in page.text("#create-result .error")


def test_reset_offsets_from_the_group_page(page: Browser, admin_console: ConsoleProcess, data: ClusterData) -> None:
    idle = Consumer(nameserver=data.nameserver, group=IDLE_GROUP, subscription={TOPIC: "*"}, start_from="first",
                    auto_commit=False)
    try:
        idle.commit({(TOPIC, q): n for q, n in enumerate(SENT_PER_QUEUE)})  # caught up: no lag
    finally:
        idle.close()
    page.open(admin_console.url(f"/groups/{IDLE_GROUP}"))
    assert page.text("#total-lag") == "0"
    _reset(page, to="earliest")
    page.wait_for(lambda: page.js("return document.getElementById('reset-result').dataset.state") == "done",
                  "the reset")
    assert page.text("#reset-result").startswith(f"reset {TOPIC}/0 → 0")
    page.wait_for(lambda: page.text("#total-lag") == str(sum(SENT_PER_QUEUE)), "the lag of a group moved back")
    page.screenshot("admin-reset-offsets")


def test_reset_offsets_of_a_group_with_live_members_needs_force(page: Browser, admin_console: ConsoleProcess,
                                                                data: ClusterData) -> None:
    page.open(admin_console.url(f"/groups/{GROUP}"))
    _reset(page, to="offset", value="1")
    page.wait_for(lambda: page.js("return document.getElementById('reset-result').dataset.state") == "error",
                  "the reset to be refused")
    assert "live member" in page.text("#reset-result .error")
    assert page.text("#total-lag") == str(data.total_lag)  # nothing moved


def _reset(page: Browser, *, to: str, value: str = "") -> None:
    form = page.driver.find_element("id", "reset-offsets")
    page.wait_for(lambda: page.js("return document.querySelectorAll('#reset-offsets [name=topic] option').length") > 0,
                  "the group's topics in the form")
    form.find_element("css selector", f"[name=topic] option[value='{TOPIC}']").click()
    form.find_element("css selector", f"[name=to] option[value='{to}']").click()
    form.find_element("name", "value").send_keys(value)
    form.find_element("css selector", "button").click()
