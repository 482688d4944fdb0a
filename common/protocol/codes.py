"""Request codes and response statuses of the gms wire protocol.

Numbers are grouped by area so a code tells at a glance who serves it, and each
area has room to grow. Numbers are part of the wire format: never renumber, only
add. Every code and status is described in ``docs/protocol.md``.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class RequestCode(IntEnum):
    """What a request asks for (header field ``code``)."""

    # 1-9: connection level, answered by every gms server.
    PING = 1
    AUTHENTICATE = 2  # one SASL step (SCRAM-SHA-256); the connection's identity once it succeeds

    # 10-29: producing and consuming messages (broker).
    SEND = 10
    SEND_BATCH = 11
    PULL = 12
    QUERY_MIN_OFFSET = 13
    QUERY_MAX_OFFSET = 14
    QUERY_OFFSET_BY_TIME = 15
    VIEW_MESSAGE_BY_ID = 16
    CANCEL_SCHEDULED = 17  # recall a scheduled message before its time (by its message id)
    POP_MESSAGE = 18  # hand out messages of a topic's queues to a group, invisible until acked
    ACK_MESSAGE = 19  # acknowledge popped messages by (queue, offset, delivery attempt)
    CHANGE_INVISIBLE_DURATION = 20  # move when a popped message becomes visible again
    FIND_BY_KEY = 21  # the newest messages of a topic carrying a key (the store's key index)
    END_TRANSACTION = 22  # commit or roll back a transaction's half messages on this broker
    CHECK_TRANSACTIONS = 23  # a producer group's long poll for open transactions to resolve (check-back)
    FETCH = 24  # many queues of one broker in one long poll, a result per queue (gms.protocol.fetch)

    # 30-49: consumer groups (broker).
    COMMIT_OFFSET = 30
    FETCH_OFFSET = 31
    HEARTBEAT = 32
    UNREGISTER_CONSUMER = 33
    GET_CONSUMER_GROUP_MEMBERS = 34
    FIND_COORDINATOR = 35

    # 50-69: administration (broker).
    CREATE_TOPIC = 50
    UPDATE_TOPIC = 51
    DELETE_TOPIC = 52
    TOPIC_LIST = 53
    TOPIC_STATS = 54
    BROKER_STATUS = 55
    RESET_OFFSETS = 56
    DELETE_GROUP = 57
    LIST_TRANSACTIONS = 58  # the open transactions a broker holds (``gms tx list``)
    CREATE_TOPICS = 59  # many topics in one request, a result per topic (nameserver and standalone broker)
    DELETE_OFFSETS = 60  # a group's committed offsets of some queues (Kafka's OffsetDelete, at each queue's leader)

    # 100-119: nameserver.
    REGISTER_BROKER = 100
    UNREGISTER_BROKER = 101
    GET_ROUTE = 102
    GET_BROKER_LIST = 103
    CLUSTER_STATUS = 104
    GROUP_SETTINGS_PUT = 105  # a consumer group's settings (retries, FIFO), kept in etcd
    GROUP_SETTINGS_GET = 106
    GROUP_SETTINGS_DELETE = 107
    INIT_PRODUCER_ID = 108  # allocate an idempotent producer's id (a counter in etcd)

    # 120-139: security administration on the nameserver (super users only).
    USER_PUT = 120  # create a user or replace its role and credential (a SCRAM verifier, never a password)
    USER_DELETE = 121
    USER_LIST = 122
    ACL_ADD = 123
    ACL_REMOVE = 124
    ACL_LIST = 125

    # 200-219: replication between brokers.
    REPLICA_FETCH = 200
    LEADER_AND_ISR = 201
    OFFSET_FOR_LEADER_EPOCH = 202
    REPLICA_COMPACTED = 203


class Status(IntEnum):
    """Outcome of a request (header field ``status``); 0 is success."""

    SUCCESS = 0

    # 1-19: server condition, independent of the request.
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    TIMEOUT = 3
    SERVICE_UNAVAILABLE = 4
    CONNECTION_CLOSED = 5  # client side only: never sent on the wire

    # 20-39: the frame or request itself is wrong.
    BAD_REQUEST = 20
    MALFORMED_FRAME = 21
    FRAME_TOO_LARGE = 22
    UNKNOWN_CODE = 23

    # 40-59: topics, queues, messages.
    TOPIC_NOT_FOUND = 40
    QUEUE_NOT_FOUND = 41
    INVALID_TOPIC = 42
    TOPIC_ALREADY_EXISTS = 43
    MESSAGE_ILLEGAL = 44
    BAD_TAG_EXPRESSION = 45
    OFFSET_ILLEGAL = 46
    MESSAGE_NOT_FOUND = 47
    OUT_OF_ORDER_SEQUENCE = 48  # an idempotent producer's batch skips sequence numbers
    PRODUCER_FENCED = 49  # an idempotent producer's batch of an older epoch than the broker knows
    TRANSACTION_NOT_FOUND = 50  # no open transaction with that id on this broker
    UNKNOWN_PRODUCER_ID = 51  # an idempotent producer's batch past 0 on a queue whose broker does not know it
    DUPLICATE_BATCH = 52  # a send of several queues' batches holds one stored before: nothing stored

    # 60-79: consumer groups.
    GROUP_NOT_FOUND = 60
    GROUP_NOT_EMPTY = 61
    NOT_COORDINATOR = 62
    QUEUE_HELD = 63
    RECEIPT_HANDLE_EXPIRED = 64  # a popped message was handed out again (or is unknown) since

    # 80-99: replication and durability.
    NOT_LEADER = 80
    NOT_ENOUGH_REPLICAS = 81
    FLUSH_TIMEOUT = 82
    FENCED_LEADER_EPOCH = 83
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 84  # stored on the leader, the ISR shrank before the ack

    # 100-119: security.
    UNAUTHENTICATED = 100  # no identity yet, or the credentials were refused
    FORBIDDEN = 101  # the identity lacks the permission (``fields``: resource, operation)


class Flag(IntFlag):
    """Bits of the header field ``flags``; receivers ignore unknown bits."""

    NONE = 0
    RESPONSE = 1  # this frame answers the request with the same id
    ONEWAY = 2  # the sender wants no response
