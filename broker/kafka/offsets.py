"""OffsetCommit and OffsetFetch: a Kafka consumer group's committed offsets are the gms group's
(the group service's), so ``gms group describe`` shows them and gms consumers of the group start
from them. A Kafka consumer commits to the group's coordinator; gms keeps a queue's offsets at the
queue's leader, so the coordinator commits (and reads) each at its leader, over its own
connection to it where that is another broker. A commit's metadata string is not kept (answered empty). The committing
member and generation of a consumer in a Kafka group are checked (:mod:`.groups`)."""

from __future__ import annotations

from typing import Any

from gms.broker.kafka.errors import Err, code_of
from gms.broker.kafka.groups import GroupError, KafkaGroups
from gms.broker.services import Services
from gms.errors import GmsError, GroupNotFoundError
from gms.protocol.groups import QueueOffset, QueueRef


class Offsets:
    def __init__(self, services: Services, members: KafkaGroups) -> None:
        self.groups = services.groups
        self.members = members

    async def offset_commit(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        group = req["group_id"]
        refused: int | None = None
        try:
            self.members.check_commit(group, req.get("member_id", ""), req.get("generation_id_or_member_epoch", -1),
                                      req.get("group_instance_id"))
        except GroupError as err:
            refused = err.code
        entries = [QueueOffset(topic["name"], p["partition_index"], p["committed_offset"])
                   for topic in req["topics"] for p in topic["partitions"]]
        errors = [None] * len(entries) if refused is not None else await self.groups.commit_at_leaders(group, entries)
        codes = iter([refused if refused is not None else Err.NONE if err is None else _group_code(err)
                      for err in errors])
        return {"topics": [{"name": topic["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": next(codes)} for p in topic["partitions"]]}
            for topic in req["topics"]]}

    async def offset_fetch(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        if version < 8:
            found = await self._group(req["group_id"], req["topics"])
            return {"topics": found["topics"], "error_code": found["error_code"]}
        return {"groups": [{"group_id": group["group_id"], **await self._group(group["group_id"], group["topics"])}
                           for group in req["groups"]]}

    async def _group(self, group: str, topics: list[dict[str, Any]] | None) -> dict[str, Any]:
        """One group's committed offsets, of ``topics`` (None: every topic it committed on this
        broker), each asked of its queue's leader."""
        try:
            if topics is None:
                try:
                    committed = self.groups.describe(group, members=False).offsets
                except GroupNotFoundError:
                    committed = {}
                rows = [{"name": name, "partitions": [_row(q, offset) for q, offset in sorted(queues.items())]}
                        for name, queues in sorted(committed.items())]
                return {"error_code": 0, "topics": rows}
            refs = [QueueRef(topic["name"], q) for topic in topics for q in topic["partition_indexes"]]
            found = iter(await self.groups.committed_at_leaders(group, refs))
        except GmsError as err:
            return {"error_code": _group_code(err), "topics": []}
        return {"error_code": 0, "topics": [
            {"name": topic["name"], "partitions": [_row(q, next(found)) for q in topic["partition_indexes"]]}
            for topic in topics]}


def _row(queue_id: int, offset: int | GmsError | None) -> dict[str, Any]:
    if isinstance(offset, GmsError):
        return {"partition_index": queue_id, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                "error_code": _group_code(offset)}
    return {"partition_index": queue_id, "committed_offset": -1 if offset is None else offset,
            "committed_leader_epoch": -1, "metadata": "", "error_code": 0}


def _group_code(err: GmsError) -> int:
    code = code_of(err)
    return Err.INVALID_GROUP_ID if code == Err.INVALID_REQUEST else code
