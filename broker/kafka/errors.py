"""Kafka's error codes, and the one each :mod:`gms.errors` error answers."""

from __future__ import annotations

import enum

from gms import errors
from gms.store_errors import BodyTooLarge, MessageTooLarge


class Err(enum.IntEnum):
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    MISMATCHED_ENDPOINT_TYPE = 114
    UNKNOWN_SERVER_ERROR = -1


# Most specific first: isinstance picks the first that matches.
_BY_CLASS: tuple[tuple[type[errors.GmsError], Err], ...] = (
    (errors.TopicNotFoundError, Err.UNKNOWN_TOPIC_OR_PARTITION),
    (errors.QueueNotFoundError, Err.UNKNOWN_TOPIC_OR_PARTITION),
    (errors.NotLeaderError, Err.NOT_LEADER_OR_FOLLOWER),
    (errors.NotEnoughReplicasAfterAppendError, Err.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    (errors.NotEnoughReplicasError, Err.NOT_ENOUGH_REPLICAS),
    (errors.FencedLeaderEpochError, Err.FENCED_LEADER_EPOCH),
    (errors.OffsetIllegalError, Err.OFFSET_OUT_OF_RANGE),
    (MessageTooLarge, Err.MESSAGE_TOO_LARGE),  # over the topic's max.message.bytes
    (BodyTooLarge, Err.MESSAGE_TOO_LARGE),
    (errors.MessageIllegalError, Err.INVALID_RECORD),
    (errors.InvalidTopicError, Err.INVALID_TOPIC_EXCEPTION),
    (errors.TopicAlreadyExistsError, Err.TOPIC_ALREADY_EXISTS),
    (errors.NotCoordinatorError, Err.NOT_COORDINATOR),
    (errors.GroupNotFoundError, Err.GROUP_ID_NOT_FOUND),
    (errors.GroupNotEmptyError, Err.NON_EMPTY_GROUP),
    (errors.OutOfOrderSequenceError, Err.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (errors.SequenceTooOldError, Err.DUPLICATE_SEQUENCE_NUMBER),
    (errors.ProducerFencedError, Err.INVALID_PRODUCER_EPOCH),
    (errors.UnknownProducerIdError, Err.UNKNOWN_PRODUCER_ID),
    (errors.ForbiddenError, Err.TOPIC_AUTHORIZATION_FAILED),
    (errors.UnauthenticatedError, Err.SASL_AUTHENTICATION_FAILED),
    (errors.RequestTimeoutError, Err.REQUEST_TIMED_OUT),
    (errors.FlushTimeoutError, Err.REQUEST_TIMED_OUT),
    (errors.ServiceUnavailableError, Err.LEADER_NOT_AVAILABLE),
    (errors.ServerBusyError, Err.REQUEST_TIMED_OUT),
    (errors.BadRequestError, Err.INVALID_REQUEST),
)


def code_of(err: Exception) -> Err:
    """The Kafka error code a gms error answers (UNKNOWN_SERVER_ERROR for any other)."""
    for cls, code in _BY_CLASS:
        if isinstance(err, cls):
            return code
    return Err.UNKNOWN_SERVER_ERROR
