"""gms's ACLs on Kafka requests, when authentication is on (docs/security.md, docs/kafka-compat.md).

Each request needs what the gms request doing the same needs; a refused resource gets Kafka's
code (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED) in
its own row, and nothing is done to it: rows of requests that change something are taken out
before the request is served, rows of a read are answered refused. Topics a principal may not
describe are left out of Metadata for all topics, and groups out of ListGroups.

====================================================  ========================================
Produce                                               publish on the topic (the message service)
Fetch                                                 subscribe on the topic (the message service)
Metadata, ListOffsets                                 describe on the topic
OffsetCommit, OffsetFetch                             subscribe on the group, describe on the topic
FindCoordinator, DescribeGroups, ListGroups           describe on the group
JoinGroup, SyncGroup, Heartbeat, LeaveGroup           subscribe on the group
DeleteGroups                                          admin on the group
OffsetDelete                                          admin on the group, subscribe on the topic
CreateTopics, DeleteTopics, CreatePartitions          admin on the topic
DescribeConfigs / AlterConfigs, IncrementalAlter...   describe / admin on the topic (a broker's:
                                                      on the cluster)
DescribeCluster                                       describe on the cluster
DeleteRecords                                         admin on the topic
ElectLeaders                                          admin on the cluster
ApiVersions, SaslHandshake/Authenticate, InitProducerId   any authenticated principal
====================================================  ========================================
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from gms.broker.kafka.apis import ApiKey
from gms.broker.kafka.errors import Err
from gms.broker.services.topics import ACTING_FOR
from gms.security.authorizer import CLUSTER, Authorizer
from gms.security.gate import audit
from gms.security.users import Principal

Handler = Callable[[dict[str, Any], int, str], Awaitable[dict[str, Any] | None] | dict[str, Any] | None]
TOPIC_TYPE, BROKER_TYPE = 2, 4  # DescribeConfigs' and AlterConfigs' resource types
_CODES = {"topic": Err.TOPIC_AUTHORIZATION_FAILED, "group": Err.GROUP_AUTHORIZATION_FAILED,
          CLUSTER: Err.CLUSTER_AUTHORIZATION_FAILED}


class _Ask:
    """One request of ``principal``'s under way: what it may do, and the handler serving it."""

    def __init__(self, authorizer: Authorizer, principal: Principal, key: ApiKey, handler: Handler,
                 req: dict[str, Any], version: int, client: str) -> None:
        self.authorizer, self.principal, self.key = authorizer, principal, key
        self.handler, self.req, self.version, self.client = handler, req, version, client

    def refused(self, resource: str, name: str, operation: str, quiet: bool = False) -> int:
        """0 if the principal may ``operation`` the resource, else the Kafka code refusing it
        (audited unless ``quiet``: a listing leaving the resource out)."""
        if self.authorizer.allowed(self.principal, resource, name, operation):
            return 0
        if not quiet:
            audit.warning("refused kafka %s from %s (%s): may not %s %s %s", self.key.name, self.principal,
                          self.client, operation, resource, name)
        return _CODES[resource]

    async def run(self, req: dict[str, Any] | None = None) -> dict[str, Any]:
        """The handler's answer; a topic change it makes at the nameservers is made for the principal."""
        acting = ACTING_FOR.set(self.principal)
        try:
            body = await served(self.handler, self.req if req is None else req, self.version, self.client)
        finally:
            ACTING_FOR.reset(acting)
        assert body is not None  # only a produce with acks=0 goes unanswered, and Produce has no rule
        return body


async def served(handler: Handler, req: dict[str, Any], version: int, client: str) -> dict[str, Any] | None:
    """The handler's answer (awaited if it is a coroutine)."""
    body = handler(req, version, client)
    if inspect.isawaitable(body):
        return await body
    return body


Rule = Callable[[_Ask], Awaitable[dict[str, Any]]]


class KafkaAccess:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def answer(self, key: ApiKey, handler: Handler, req: dict[str, Any], version: int, client: str,
                     principal: Principal) -> dict[str, Any] | None:
        """The answer to a request of ``principal``, with what it may not do refused."""
        rule = _RULES.get(key)
        ask = _Ask(self.authorizer, principal, key, handler, req, version, client)
        return await (served(handler, req, version, client) if rule is None else rule(ask))


# -- rules ------------------------------------------------------------------------------------------

def _named_rows(rows_in: str, rows_out: str, check: Callable[[_Ask, Any], int],
                refusal: Callable[[Any, int], dict[str, Any]]) -> Rule:
    """Rows of the request (``rows_in``) each answered by a row of ``rows_out``: the refused ones
    taken out before the request is served and answered ``refusal``."""
    async def rule(ask: _Ask) -> dict[str, Any]:
        kept, refused = [], []
        for row in ask.req[rows_in] or ():
            code = check(ask, row)
            if code:
                refused.append(refusal(row, code))
            else:
                kept.append(row)
        answer = await ask.run({**ask.req, rows_in: kept})
        answer[rows_out] = [*answer.get(rows_out, ()), *refused]
        return answer
    return rule


def _on(resource: str, operation: str, name: Callable[[Any], str]) -> Callable[[_Ask, Any], int]:
    return lambda ask, row: ask.refused(resource, name(row), operation)


def _config(operation: str) -> Callable[[_Ask, Any], int]:
    def check(ask: _Ask, row: dict[str, Any]) -> int:
        if row["resource_type"] == TOPIC_TYPE:
            return ask.refused("topic", row["resource_name"], operation)
        if row["resource_type"] == BROKER_TYPE:
            return ask.refused(CLUSTER, CLUSTER, operation)
        return 0  # the handler refuses what it does not serve
    return check


def _config_refusal(row: dict[str, Any], code: int) -> dict[str, Any]:
    return {**_error(code), "resource_type": row["resource_type"],
            "resource_name": row["resource_name"]}


def _topic_refusal(row: Any, code: int) -> dict[str, Any]:
    return {"name": row["name"] if isinstance(row, dict) else row, **_error(code)}


def _error(code: int) -> dict[str, Any]:
    """A refused row's error fields."""
    return {"error_code": code, "error_message": "not authorised"}


def _partitions_refused(row: dict[str, Any], code: int, indexes: str = "partitions") -> dict[str, Any]:
    """A topic row of a partitioned answer (ListOffsets, OffsetCommit, OffsetFetch) refused."""
    ids = [p if isinstance(p, int) else p["partition_index"] for p in row[indexes] or ()]
    return {"name": row["name"], "partitions": [{"partition_index": i, "error_code": code, "offset": -1,
                                                 "timestamp": -1, "committed_offset": -1} for i in ids]}


async def _group_member(ask: _Ask) -> dict[str, Any]:
    code = ask.refused("group", ask.req["group_id"], "subscribe")
    return {"error_code": code} if code else await ask.run()


async def _offset_delete(ask: _Ask) -> dict[str, Any]:
    code = ask.refused("group", ask.req["group_id"], "admin")
    if code:
        return {"error_code": code, "topics": []}
    return await _named_rows("topics", "topics", _on("topic", "subscribe", lambda row: row["name"]),
                             _partitions_refused)(ask)


async def _elect_leaders(ask: _Ask) -> dict[str, Any]:
    code = ask.refused(CLUSTER, CLUSTER, "admin")
    if not code:
        return await ask.run()
    return {"error_code": code, "replica_election_results": [  # v0 has no top-level code: each row's
        {"topic": row["topic"], "partition_result": [{"partition_id": p, **_error(code)} for p in row["partitions"]]}
        for row in ask.req["topic_partitions"] or ()]}


async def _describe_cluster(ask: _Ask) -> dict[str, Any]:
    code = ask.refused(CLUSTER, CLUSTER, "describe")
    return {"error_code": code, "error_message": "not authorised"} if code else await ask.run()


async def _find_coordinator(ask: _Ask) -> dict[str, Any]:
    def check(ask: _Ask, key: str) -> int:
        return ask.refused("group", key, "describe") if ask.req.get("key_type", 0) == 0 else 0
    if ask.version >= 4:
        return await _named_rows("coordinator_keys", "coordinators", check, lambda key, code: {
            "key": key, "node_id": -1, "host": "", "port": -1, "error_code": code,
            "error_message": "not authorised"})(ask)
    code = check(ask, ask.req["key"])
    return ({"error_code": code, "error_message": "not authorised", "node_id": -1, "host": "", "port": -1}
            if code else await ask.run())


async def _offset_commit(ask: _Ask) -> dict[str, Any]:
    group_code = ask.refused("group", ask.req["group_id"], "subscribe")
    return await _named_rows("topics", "topics",
                             lambda ask, row: group_code or ask.refused("topic", row["name"], "describe"),
                             _partitions_refused)(ask)


async def _offset_fetch(ask: _Ask) -> dict[str, Any]:
    if ask.version >= 8:
        return await _offset_fetch_groups(ask)
    code = ask.refused("group", ask.req["group_id"], "subscribe")
    if code:
        return {"error_code": code, "topics": [_partitions_refused(t, code, "partition_indexes")
                                               for t in ask.req["topics"] or ()]}
    rule = _named_rows("topics", "topics", lambda ask, row: ask.refused("topic", row["name"], "describe"),
                       lambda row, code: _partitions_refused(row, code, "partition_indexes"))
    if ask.req["topics"] is not None:
        return await rule(ask)
    answer = await ask.run()  # every topic the group committed: those it may describe
    answer["topics"] = [t for t in answer["topics"] if not ask.refused("topic", t["name"], "describe", True)]
    return answer


async def _offset_fetch_groups(ask: _Ask) -> dict[str, Any]:
    """OffsetFetch v8+: each group's refused or its topics', as :func:`_offset_fetch` answers one."""
    groups, refused = [], []
    denied: dict[str, list[dict[str, Any]]] = {}
    for group in ask.req["groups"]:
        code = ask.refused("group", group["group_id"], "subscribe")
        if code:
            refused.append({"group_id": group["group_id"], "error_code": code, "topics": []})
            continue
        topics = group["topics"]
        if topics is not None:
            codes = [ask.refused("topic", t["name"], "describe") for t in topics]
            denied[group["group_id"]] = [_partitions_refused(t, c, "partition_indexes")
                                         for t, c in zip(topics, codes, strict=True) if c]
            topics = [t for t, c in zip(topics, codes, strict=True) if not c]
        groups.append({**group, "topics": topics})
    answer = await ask.run({**ask.req, "groups": groups}) if groups else {"groups": []}
    for group in answer["groups"]:
        group["topics"] = [*(t for t in group["topics"] if not ask.refused("topic", t["name"], "describe", True)),
                           *denied.get(group["group_id"], ())]
    answer["groups"] += refused
    return answer


async def _metadata(ask: _Ask) -> dict[str, Any]:
    """Topics asked for by name and refused are answered refused; of all topics, those the
    principal may describe."""
    asked = {t["name"] for t in ask.req["topics"] or ()}  # (v0 asks for all with none)
    answer = await ask.run()
    rows = []
    for row in answer["topics"]:
        code = ask.refused("topic", row["name"], "describe", quiet=row["name"] not in asked)
        if not code:
            rows.append(row)
        elif row["name"] in asked:
            rows.append({"error_code": code, "name": row["name"], "is_internal": False, "partitions": []})
    answer["topics"] = rows
    return answer


async def _list_groups(ask: _Ask) -> dict[str, Any]:
    answer = await ask.run()
    if ask.refused(CLUSTER, CLUSTER, "describe", quiet=True):
        answer["groups"] = [g for g in answer["groups"] if not ask.refused("group", g["group_id"], "describe", True)]
    return answer


_RULES: dict[ApiKey, Rule] = {
    ApiKey.METADATA: _metadata,
    ApiKey.LIST_OFFSETS: _named_rows("topics", "topics", _on("topic", "describe", lambda row: row["name"]),
                                     _partitions_refused),
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _group_member,
    ApiKey.SYNC_GROUP: _group_member,
    ApiKey.HEARTBEAT: _group_member,
    ApiKey.LEAVE_GROUP: _group_member,
    ApiKey.DESCRIBE_GROUPS: _named_rows("groups", "groups", _on("group", "describe", str), lambda group, code: {
        "group_id": group, "error_code": code, "group_state": "", "protocol_type": "", "protocol_data": ""}),
    ApiKey.LIST_GROUPS: _list_groups,
    ApiKey.OFFSET_DELETE: _offset_delete,
    ApiKey.DELETE_GROUPS: _named_rows("groups_names", "results", _on("group", "admin", str),
                                      lambda group, code: {"group_id": group, "error_code": code}),
    ApiKey.CREATE_TOPICS: _named_rows("topics", "topics", _on("topic", "admin", lambda row: row["name"]),
                                      _topic_refusal),
    ApiKey.DELETE_TOPICS: _named_rows("topic_names", "responses", _on("topic", "admin", str), _topic_refusal),
    ApiKey.CREATE_PARTITIONS: _named_rows("topics", "results", _on("topic", "admin", lambda row: row["name"]),
                                          _topic_refusal),
    ApiKey.DESCRIBE_CONFIGS: _named_rows("resources", "results", _config("describe"), _config_refusal),
    ApiKey.ALTER_CONFIGS: _named_rows("resources", "responses", _config("admin"), _config_refusal),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _named_rows("resources", "responses", _config("admin"), _config_refusal),
    ApiKey.DESCRIBE_CLUSTER: _describe_cluster,
    ApiKey.DELETE_RECORDS: _named_rows("topics", "topics", _on("topic", "admin", lambda row: row["name"]),
                                       lambda row, code: {"name": row["name"], "partitions": [
                                           {"partition_index": p["partition_index"], "low_watermark": -1,
                                            "error_code": code} for p in row["partitions"]]}),
    ApiKey.ELECT_LEADERS: _elect_leaders,
}
