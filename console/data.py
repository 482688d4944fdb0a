"""What the console shows, read through the public SDK's :class:`gms.client.Admin`: one method per
page, each returning JSON-ready values (the same calls ``gms cluster``, ``gms topic describe``,
``gms group describe`` and ``gms msg show`` make).

Synchronous, as Admin is: the HTTP handlers and the sampler run these in threads
(``asyncio.to_thread``); Admin hands every call to its own I/O loop, which is thread-safe.
"""

from __future__ import annotations

from typing import Any

from gms.client import Admin
from gms.client.display import body_text, group_lag, message_dict
from gms.errors import GmsError, GroupNotFoundError, MessageNotFoundError
from gms.msgid import decode_msg_id

# A page shows the start of a body: a whole 4 MiB body would stall the browser for nothing.
BODY_PREVIEW_BYTES = 4096
KEY_MATCHES_SHOWN = 64  # messages a lookup by key lists (newest)
KEY_BODY_PREVIEW_BYTES = 120  # a table cell's worth
# What the cluster page shows of each broker's BROKER_STATUS answer.
BROKER_STATUS_FIELDS = ("version", "uptime_s", "flush_mode", "store_health", "disk_used_bytes", "topics",
                        "connections", "error")
STORE_TROUBLE = {  # BROKER_STATUS store_health values that need an operator, and what to do
    "read_only": "a disk flush failed and it refuses writes until restarted: check the disk, then restart it",
    "disk_full": "the disk is full: sends that need more space fail; free disk space or shorten the retention",
}


class BadInput(ValueError):
    """A request the console refuses before asking the cluster; the message says what to send."""


class ConsoleData:
    """The console's reads: cluster, topics, groups and single messages."""

    def __init__(self, admin: Admin) -> None:
        self._admin = admin

    # --- cluster ---------------------------------------------------------------------------------

    def cluster(self) -> dict[str, Any]:
        """Nameservers and the controller, every registered broker with its status, etcd health,
        the queues without a live leader or below their minimum ISR, and the problems in words."""
        status = self._admin.cluster_status()
        answers = {s["address"]: s for s in self._admin.broker_status()}
        controller = status.get("controller") or {"id": None, "epoch": 0}
        brokers = []
        for info in sorted(status["brokers"], key=lambda b: b["address"]):
            answer = answers.get(info["address"], {"error": "registered after the status was read; reload"})
            brokers.append({**info, "alive": "error" not in answer,
                            **{name: answer.get(name) for name in BROKER_STATUS_FIELDS}})
        nameservers = [{**n, "controller": n["address"] == controller["id"]} for n in status["nameservers"]]
        queues = status["queues"]
        return {"etcd": status["etcd"], "nameservers": nameservers, "controller": controller, "brokers": brokers,
                "topics": status["topics"], "queues": queues, "problems": _cluster_problems(status["etcd"], brokers,
                                                                                            queues)}

    # --- topics ----------------------------------------------------------------------------------

    def topics(self) -> list[dict[str, Any]]:
        """Every topic: its queue count, the messages its queues hold and ``appended``, the sum of
        their max offsets (what was ever written: rates are its change). A topic whose brokers
        do not answer has ``error`` instead of counts, so one dead broker does not hide the rest."""
        topics = self._admin.topics()
        stats = self._admin.topics_stats(topics)
        rows = []
        for topic, queues in sorted(topics.items()):
            row: dict[str, Any] = {"topic": topic, "queues": queues, "messages": None, "appended": None}
            entries = stats.get(topic)
            if entries is None:
                continue  # deleted since the list was read
            if isinstance(entries, GmsError):
                row["error"] = str(entries)
            else:
                row["messages"] = sum(s["max_offset"] - s["min_offset"] for s in entries)
                row["appended"] = sum(s["max_offset"] for s in entries)
            rows.append(row)
        return rows

    def topic(self, topic: str) -> dict[str, Any]:
        """One topic's settings and queues: leader, replicas, leader epoch, ISR state, min and max
        offsets and message counts. TopicNotFoundError if there is no such topic.

        ``isr`` is the route's (the registered in-sync replicas); the nameserver's cluster status
        names the queues whose ISR is below the topic's minimum and those without a live leader,
        so each queue's ``isr_state`` is ``ok`` (at least the minimum in sync), ``under_min`` or
        ``no_leader``."""
        route = self._admin.route(topic, settings=True)
        led = any(q["leader"] for q in route["queues"])
        stats = {s["queue_id"]: s for s in self._admin.topic_stats(topic)} if led else {}
        health = self._admin.cluster_status()["queues"]
        under_min = {q["queue_id"] for q in health["under_min_isr"] if q["topic"] == topic}
        leaderless = {q["queue_id"] for q in health["without_leader"] if q["topic"] == topic}
        queues = []
        for q in route["queues"]:
            stat = stats.get(q["queue_id"], {"min_offset": None, "max_offset": None})
            low, high = stat["min_offset"], stat["max_offset"]
            state = ("no_leader" if q["queue_id"] in leaderless or not q["leader"]
                     else "under_min" if q["queue_id"] in under_min else "ok")
            queues.append({**q, "min_offset": low, "max_offset": high,
                           "messages": None if high is None else high - low,
                           "isr_state": state})
        counted = [q for q in queues if q["messages"] is not None]
        return {"topic": topic, "replication_factor": route["replication_factor"], "settings": route["settings"],
                "queues": queues, "messages": sum(q["messages"] for q in counted),
                "appended": sum(q["max_offset"] for q in counted)}

    # --- consumer groups -------------------------------------------------------------------------

    def groups(self) -> list[dict[str, Any]]:
        """Every group the live brokers know: its member count and total lag."""
        rows = []
        for name in self._admin.groups():
            try:
                described = self._admin.group_describe(name)
            except GroupNotFoundError:
                continue  # deleted since the list was read
            lag = group_lag(self._admin, described)
            rows.append({"group": name, "members": len({m["member"] for m in described["members"]}),
                         "lag": sum(r["lag"] or 0 for r in lag)})
        return rows

    def group(self, group: str) -> dict[str, Any]:
        """One group's members (mode, subscription, queues held, last heartbeat) and, per queue it
        committed on or holds, the committed and max offsets and the lag. GroupNotFoundError if
        no broker knows it."""
        try:
            described = self._admin.group_describe(group)
        except GroupNotFoundError as err:
            raise GroupNotFoundError(f"no broker knows group {group!r}: a group is known once a consumer of it"
                                     " joins or commits (check the name on the groups page)") from err
        rows = group_lag(self._admin, described)
        members: dict[str, dict[str, Any]] = {}
        for m in described["members"]:  # listed once per broker leading queues it holds: merge them
            fields = {name: value for name, value in m.items() if name not in ("broker", "queues")}
            entry = members.setdefault(m["member"], {**fields, "brokers": [], "queues": []})
            entry["brokers"] = sorted({*entry["brokers"], m["broker"]})
            entry["queues"] = sorted({*map(tuple, entry["queues"]), *map(tuple, m["queues"])})
        return {"group": group, "members": list(members.values()), "queues": rows,
                "lag": sum(r["lag"] or 0 for r in rows)}

    # --- messages --------------------------------------------------------------------------------

    def message(self, msg_id: str) -> dict[str, Any]:
        """The message ``msg_id`` names, from the broker the id names: where it is stored, tag,
        keys, properties, times and the start of its body (``body_preview``, readable text or
        escaped bytes)."""
        msg_id = msg_id.strip()
        try:
            located = decode_msg_id(msg_id)
        except ValueError as err:
            raise BadInput(f"{err}: a message id is the 32 hex digits `gms produce` prints (28 bytes for"
                           " an IPv6 broker)") from err
        try:
            found = self._admin.view_message(msg_id)
        except MessageNotFoundError as err:
            raise MessageNotFoundError(
                f"no message with id {msg_id} on broker {located.address}: it expired (retention), was never"
                " written there, or the id is mistyped") from err
        fields = message_dict(found)
        del fields["body"], fields["body_encoding"]
        body = found.body
        return {**fields, "broker": located.address, "body_bytes": len(body),
                "body_preview": body_text(body[:BODY_PREVIEW_BYTES]), "body_truncated": len(body) > BODY_PREVIEW_BYTES}

    def find_by_key(self, topic: str, key: str) -> dict[str, Any]:
        """The newest messages of ``topic`` carrying ``key`` (the brokers' key index), each as
        :meth:`message` shows one but with a shorter body preview."""
        topic, key = topic.strip(), key.strip()
        if not topic or not key or " " in key:
            raise BadInput("name a topic and one key (keys hold no spaces), as `gms msg find --topic T --key K`")
        rows = []
        for found in self._admin.find_by_key(topic, key, max_messages=KEY_MATCHES_SHOWN):
            fields = message_dict(found)
            del fields["body"], fields["body_encoding"]
            body = found.body
            rows.append({**fields, "body_bytes": len(body), "body_preview": body_text(body[:KEY_BODY_PREVIEW_BYTES])})
        return {"topic": topic, "key": key, "messages": rows}


def _cluster_problems(etcd: dict[str, Any], brokers: list[dict[str, Any]],
                      queues: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What needs an operator, one line each, saying what to do."""
    problems = [] if etcd["healthy"] else [f"etcd is unhealthy ({etcd.get('error', 'no answer')}): routes are served"
                                          " from the nameservers' cache and topic changes fail until it is back"]
    if not brokers:
        problems.append("no broker is registered: start one with `gms-broker --nameserver ...`")
    problems += [f"broker {b['address']} does not answer ({b['error']}): is it running?"
                 for b in brokers if not b["alive"]]
    problems += [f"broker {b['address']}: {STORE_TROUBLE[b['store_health']]}"
                 for b in brokers if b["store_health"] in STORE_TROUBLE]
    if queues["without_leader"]:
        problems.append(f"{len(queues['without_leader'])} queue(s) without a live leader: sends to them fail until"
                        " a broker holding a replica is back")
    if queues["under_min_isr"]:
        problems.append(f"{len(queues['under_min_isr'])} queue(s) with fewer in-sync replicas than their minimum:"
                        " acks=-1 sends to them fail until followers catch up")
    return problems
