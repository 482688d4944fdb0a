"""The Kafka API of a secured cluster (TLS with a development CA, authentication, ACLs): confluent-
kafka clients authenticate with SASL/SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN over TLS against gms's users, and
each request is held to gms's ACLs with Kafka's codes; wrong credentials and unauthenticated
clients are refused."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaAdminClient, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.errors import GroupAuthorizationFailedError

from gms.errors import ForbiddenError
from gms.net.blocking import BlockingConnection
from gms.protocol.codes import RequestCode
from gms.security.acl import AclRule
from gms.security.scram import Credential
from tests.processes import free_port, wait_until
from tests.security.secured_cluster import PASSWORDS, SecuredCluster

WAIT_S = 30
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = SecuredCluster(tmp_path_factory.mktemp("kafka-secured")).start(brokers=0)
    endpoints = []
    try:
        for _ in range(2):  # a group's commits reach the partitions' leaders on both
            endpoints.append(f"127.0.0.1:{free_port()}")
            running.broker_toml = f'[broker]\nkafka_listen = "{endpoints[-1]}"\n'
            running.add_broker()
        running.wait_registered(2)
        running.kafka = ",".join(endpoints)
        with running.admin() as admin:
            for topic in ("k-orders", "k-secret", "k-peek"):
                admin.create_topic(topic, queues=2)
            for operation in ("publish", "subscribe"):
                admin.add_acl(AclRule("alice", "topic", "k-orders", operation))
            admin.add_acl(AclRule("alice", "group", "k-billing", "subscribe"))
            admin.add_acl(AclRule("alice", "topic", "k-peek", "describe"))  # sees it, may not read it
        yield running
    finally:
        running.stop()


def config(cluster, user: str = "alice", password: str | None = None, mechanism: str = "SCRAM-SHA-256",
           **extra) -> dict:
    return {"bootstrap.servers": cluster.kafka, "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": PASSWORDS[user] if password is None else password,
            "ssl.ca.location": str(cluster.pki.ca_cert), **extra}


def produce(conf: dict, topic: str, value: bytes) -> KafkaError | None:
    """The delivery's error (None: stored)."""
    outcome: list[KafkaError | None] = []
    producer = Producer(conf)
    producer.produce(topic, value=value, partition=0, on_delivery=lambda err, _: outcome.append(err))
    producer.flush(WAIT_S)
    assert outcome, "no delivery report"
    return outcome[0]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_a_user_produces_and_consumes_in_a_group_as_its_acls_allow(cluster, mechanism):
    value = f"order-{uuid.uuid4().hex[:6]}".encode()
    assert produce(config(cluster, mechanism=mechanism, **{"enable.idempotence": True}), "k-orders", value) is None
    consumer = Consumer(config(cluster, mechanism=mechanism, **{"group.id": "k-billing",
                                                                "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe(["k-orders"])
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while value not in got and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert value in got
        offsets = [TopicPartition("k-orders", p, 1) for p in range(2)]
        consumer.commit(offsets=offsets, asynchronous=False)  # at each partition's leader
        assert [tp.offset for tp in consumer.committed(offsets, timeout=WAIT_S)] == [1, 1]
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_authenticates_with_scram(cluster, mechanism):
    producer = KafkaProducer(bootstrap_servers=cluster.kafka.split(","), security_protocol="SASL_SSL",
                             sasl_mechanism=mechanism, sasl_plain_username="alice",
                             sasl_plain_password=PASSWORDS["alice"], ssl_cafile=str(cluster.pki.ca_cert), acks="all")
    try:
        assert producer.send("k-orders", b"from kafka-python", partition=1).get(WAIT_S).offset >= 0
    finally:
        producer.close()


def test_what_the_acls_do_not_allow_gets_kafkas_authorisation_codes(cluster):
    err = produce(config(cluster, **{"message.timeout.ms": 10_000}), "k-secret", b"x")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    admin = AdminClient(config(cluster))
    assert set(admin.list_topics(timeout=WAIT_S).topics) == {"k-orders", "k-peek"}  # what alice may describe
    created = admin.create_topics([NewTopic("k-new", 1, 1)])["k-new"]
    with pytest.raises(KafkaException) as refused:
        created.result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    broker = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(admin.list_topics(timeout=WAIT_S).brokers))))
    with pytest.raises(KafkaException) as refused:
        admin.describe_configs([broker])[broker].result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    assert first_error(Consumer(config(cluster, **{"group.id": "k-other"})), subscribe=["k-orders"]) == \
        KafkaError.GROUP_AUTHORIZATION_FAILED
    assert first_error(Consumer(config(cluster, **{"group.id": "k-billing"})), subscribe=["k-secret"]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED  # its metadata refused
    assert first_error(Consumer(config(cluster, **{"group.id": "k-billing"})),
                       assign=[TopicPartition("k-peek", 0, 0)]) == KafkaError.TOPIC_AUTHORIZATION_FAILED  # fetch


def test_deleting_records_and_group_offsets_and_electing_leaders_need_admin_rights(cluster):
    alice = AdminClient(config(cluster))
    deleted = alice.delete_records([TopicPartition("k-orders", 0, 0)])
    with pytest.raises(KafkaException) as refused:
        next(iter(deleted.values())).result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    elected = alice.elect_leaders(ElectionType.PREFERRED, [TopicPartition("k-orders", 0)])
    with pytest.raises(KafkaException) as refused:
        elected.result(WAIT_S)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka.split(","), security_protocol="SASL_SSL",
                          sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                          sasl_plain_password=PASSWORDS["alice"], ssl_cafile=str(cluster.pki.ca_cert))
    try:
        with pytest.raises(GroupAuthorizationFailedError):  # alice may consume in k-billing, not administer it
            kp.delete_group_offsets("k-billing", [KpTopicPartition("k-orders", 0)])
    finally:
        kp.close()
    admin = AdminClient(config(cluster, "admin"))
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("k-orders", 0)]).result(WAIT_S)
    assert [error.code() for error in result.values()] == [KafkaError.ELECTION_NOT_NEEDED]


def first_error(consumer: Consumer, subscribe: list[str] | None = None,
                assign: list[TopicPartition] | None = None) -> int | None:
    """The code of the first error a consumer's poll reports (None: none came)."""
    try:
        if subscribe:
            consumer.subscribe(subscribe)
        else:
            consumer.assign(assign)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is not None:
                return message.error().code()
        return None
    finally:
        consumer.close()


def test_wrong_credentials_and_unauthenticated_clients_are_refused(cluster):
    errors: list[KafkaError] = []
    admin = AdminClient(config(cluster, password="wrong", error_cb=errors.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    assert any(err.code() == KafkaError._AUTHENTICATION for err in errors), errors
    plain = AdminClient({"bootstrap.servers": cluster.kafka, "security.protocol": "SSL",
                         "ssl.ca.location": str(cluster.pki.ca_cert)})
    with pytest.raises(KafkaException):  # TLS but no SASL: the connection closes at its first request
        plain.list_topics(timeout=5)
    super_user = AdminClient(config(cluster, "admin"))  # the endpoint kept serving
    assert {"k-orders", "k-secret", "k-peek"} <= set(super_user.list_topics(timeout=WAIT_S).topics)


def test_a_user_stored_without_a_sha512_verifier_authenticates_with_sha256_only(cluster):
    """A user whose credential was stored before SHA-512 verifiers were kept (as an older gms
    stored it) is refused SCRAM-SHA-512 as a wrong password is, and still serves SCRAM-SHA-256."""
    credential = Credential.for_password("old-secret").to_json()
    del credential["sha512"]
    host, port = cluster.nameserver.rsplit(":", 1)
    connection = BlockingConnection.open(host, int(port), security=cluster.security("admin"))
    try:
        connection.request(RequestCode.USER_PUT, {"name": "olduser", "role": "super", "credential": credential},
                           timeout_ms=WAIT_S * 1000)
    finally:
        connection.close()
    refused: list[KafkaError] = []
    admin = AdminClient(config(cluster, "olduser", "old-secret", "SCRAM-SHA-512", error_cb=refused.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    assert any(err.code() == KafkaError._AUTHENTICATION for err in refused), refused
    sha256 = AdminClient(config(cluster, "olduser", "old-secret", "SCRAM-SHA-256"))
    assert "k-orders" in sha256.list_topics(timeout=WAIT_S).topics


def test_topic_changes_are_made_at_the_nameservers_for_the_user_as_its_rights_allow(cluster):
    admin = AdminClient(config(cluster, "admin"))  # kept until the result: its futures fail once it goes
    admin.create_topics([NewTopic("k-made", 2, 1)])["k-made"].result(WAIT_S)
    with cluster.admin() as gms_admin:
        assert gms_admin.topics()["k-made"] == 2
    alice = AdminClient(config(cluster, "alice"))  # no admin rule: refused here and at the nameservers
    for refused_future in (alice.create_topics([NewTopic("k-alices", 1, 1)])["k-alices"],
                           alice.delete_topics(["k-made"])["k-made"]):
        with pytest.raises(KafkaException) as refused:
            refused_future.result(WAIT_S)
        assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin.delete_topics(["k-made"])["k-made"].result(WAIT_S)
    wait_until(lambda: "k-made" not in admin.list_topics(timeout=WAIT_S).topics, WAIT_S)


def test_only_a_broker_credential_may_make_a_topic_change_for_another_user(cluster):
    host, port = cluster.nameserver.rsplit(":", 1)
    alice = BlockingConnection.open(host, int(port), security=cluster.security("alice"))
    try:
        with pytest.raises(ForbiddenError, match="act for"):
            alice.request(RequestCode.CREATE_TOPIC, {"topic": "k-claimed", "queues": 1,
                                                     "acting_for": ["admin", "super"]}, timeout_ms=WAIT_S * 1000)
    finally:
        alice.close()
