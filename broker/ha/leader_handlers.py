"""The leader's side of replication on the gms wire: REPLICA_FETCH, OFFSET_FOR_LEADER_EPOCH and
REPLICA_COMPACTED decoded into the replication service's arguments (gms.broker.services.replication, which does the
work) and its results encoded (their rows: gms.protocol.replication)."""

from __future__ import annotations

from typing import Any

from gms.broker.services.replication import (
    COMPACTED_CHUNK_BYTES_MAX,
    FETCH_BYTES_MAX,
    ReplicaFetchArgs,
    ReplicationService,
)
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.protocol.replication import EpochQuery, FetchWant, RepairWant
from gms.protocol.rows import decode_rows, encode


class LeaderHandlers:
    def __init__(self, replication: ReplicationService) -> None:
        self.replication = replication

    async def replica_fetch(self, request: Frame) -> Response:
        fields = request.fields
        fetched = await self.replication.fetch(ReplicaFetchArgs(
            replica=field(fields, "replica", str),
            wait_ms=field(fields, "wait_ms", int, 0),
            bytes_max=field(fields, "bytes_max", int, FETCH_BYTES_MAX),
            offsets_session=field(fields, "offsets_session", int, 0),
            queues=decode_rows(FetchWant, field(fields, "queues", list), "queues"),
            repair=decode_rows(RepairWant, field(fields, "repair", list, []), "repair")))
        answer: dict[str, Any] = {"queues": [encode(row) for row in fetched.queues],
                                  "offsets_session": fetched.offsets_session, "offsets_seq": fetched.offsets_seq}
        if fetched.repaired is not None:
            answer["repaired"] = [encode(row) for row in fetched.repaired]
        return Response(answer, body=fetched.body)

    async def offset_for_leader_epoch(self, request: Frame) -> Response:
        queries = decode_rows(EpochQuery, field(request.fields, "queues", list), "queues")
        return Response({"queues": [encode(row) for row in self.replication.leader_epochs(queries)]})

    async def replica_compacted(self, request: Frame) -> Response:
        fields = request.fields
        chunk = self.replication.compacted_chunk(
            field(fields, "topic", str), field(fields, "queue_id", int), field(fields, "leader_epoch", int),
            field(fields, "point", int, -1), field(fields, "position", int, 0),
            field(fields, "bytes_max", int, COMPACTED_CHUNK_BYTES_MAX))
        return Response({"point": chunk.point, "position": chunk.position, "next_position": chunk.next_position,
                         "size": chunk.size, "crc": chunk.crc}, body=chunk.body)
