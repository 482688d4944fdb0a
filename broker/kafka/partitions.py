"""DeleteRecords and ElectLeaders: Kafka's admin calls on partitions, as gms's queues serve them.

- **DeleteRecords** moves a queue's first offset (Kafka's log start offset, the low watermark) up
  to the offset asked (-1: the high watermark), as retention moves it: records below are served
  no more and their commitlog files go with the next retention run; the queue's followers take
  the leader's first offset with their next fetch, so a failover does not bring them back. An
  offset past the high watermark answers OFFSET_OUT_OF_RANGE; a queue of a compacted topic
  POLICY_VIOLATION (its compacted records are deleted by key), as Kafka answers both.
- **ElectLeaders**: gms's controller (the nameservers) moves a queue's leader only when its
  broker is gone, to the first in-sync replica (unclean election per the topic's
  ``unclean.leader.election.enable``), and does not move it back to the preferred replica
  (the first assigned) later. So a partition led by its preferred replica (preferred election)
  or by any live replica (unclean election) answers ELECTION_NOT_NEEDED, as Kafka does; any other
  PREFERRED_LEADER_NOT_AVAILABLE or ELIGIBLE_LEADERS_NOT_AVAILABLE, with a message saying why.
"""

from __future__ import annotations

from typing import Any

from gms.broker.kafka.errors import Err, code_of
from gms.broker.services import Services
from gms.errors import BadRequestError, GmsError, TopicNotFoundError

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types
HIGH_WATERMARK = -1  # DeleteRecords' offset meaning "up to the high watermark"
_NO_PREFERRED = ("gms moves a partition's leader only when its broker is gone, never back to its preferred "
                 "replica: the leader stays until then")
_NO_UNCLEAN = ("gms's controller elects a new leader itself once the old one is gone (an out-of-sync one only "
               "with the topic's unclean.leader.election.enable): nothing to elect on request")


class Partitions:
    def __init__(self, services: Services) -> None:
        self.topics = services.topics
        self.messages = services.messages

    async def delete_records(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        return {"topics": [{"name": topic["name"], "partitions": [
            {"partition_index": p["partition_index"],
             **await self._delete_below(topic["name"], p["partition_index"], p["offset"])}
            for p in topic["partitions"]]} for topic in req["topics"]]}

    async def _delete_below(self, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
        if not 0 <= queue_id < self.topics.queue_counts().get(topic, 0):
            return {"low_watermark": -1, "error_code": Err.UNKNOWN_TOPIC_OR_PARTITION}
        try:
            self.topics.check_led(topic, queue_id)
            high = self.messages.max_offset(topic, queue_id)
            target = high if offset == HIGH_WATERMARK else offset
            if not 0 <= target <= high:
                return {"low_watermark": -1, "error_code": Err.OFFSET_OUT_OF_RANGE}
            low = await self.topics.delete_records(topic, queue_id, target)
        except BadRequestError:  # a compacted topic
            return {"low_watermark": -1, "error_code": Err.POLICY_VIOLATION}
        except TopicNotFoundError:  # the cluster has it, this broker none of its queues (yet)
            return {"low_watermark": -1, "error_code": Err.NOT_LEADER_OR_FOLLOWER}
        except GmsError as err:
            return {"low_watermark": -1, "error_code": code_of(err)}
        return {"low_watermark": low, "error_code": 0}

    def elect_leaders(self, req: dict[str, Any], version: int, client: str) -> dict[str, Any]:
        election = req.get("election_type", PREFERRED)
        asked = req["topic_partitions"]
        if asked is None:  # every partition of every topic
            asked = [{"topic": name, "partitions": list(range(count))}
                     for name, count in sorted(self.topics.queue_counts().items())]
        if election not in (PREFERRED, UNCLEAN):
            return {"error_code": Err.INVALID_REQUEST, "replica_election_results": []}
        return {"error_code": 0, "replica_election_results": [
            {"topic": row["topic"], "partition_result": self._elections(row["topic"], row["partitions"], election)}
            for row in asked]}

    def _elections(self, topic: str, queue_ids: list[int], election: int) -> list[dict[str, Any]]:
        count = self.topics.queue_counts().get(topic, 0)
        try:
            placement = self.topics.placement(topic) if count else None
        except GmsError as err:
            return [_result(q, code_of(err), str(err)) for q in queue_ids]
        led = {} if placement is None else {p.queue_id: p for p in placement}
        results = []
        for queue_id in queue_ids:
            if not 0 <= queue_id < count:
                results.append(_result(queue_id, Err.UNKNOWN_TOPIC_OR_PARTITION, "no such partition"))
                continue
            queue = led.get(queue_id)
            if placement is None or (queue is not None and queue.leader is not None and (
                    election == UNCLEAN or queue.leader.address == queue.preferred)):
                results.append(_result(queue_id, Err.ELECTION_NOT_NEEDED, "the leader stays"))
            elif election == PREFERRED:
                results.append(_result(queue_id, Err.PREFERRED_LEADER_NOT_AVAILABLE, _NO_PREFERRED))
            else:
                results.append(_result(queue_id, Err.ELIGIBLE_LEADERS_NOT_AVAILABLE, _NO_UNCLEAN))
        return results


def _result(queue_id: int, code: int, message: str) -> dict[str, Any]:
    return {"partition_id": queue_id, "error_code": code, "error_message": message}
