"""The gms sink (batch and streaming) and a streaming query that commits a consumer group's offsets,
against a real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from processes import wait_until

from gms.client import Admin, Producer
from gms.errors import GroupNotFoundError

QUERY_TIMEOUT_S = 180
SCHEMA = ("topic string, body binary, tag string, keys array<string>, key string, "
          "properties map<string,string>, deliver_at bigint")


def create_topics(broker, **topics: int) -> None:
    with Admin(brokers=[broker.address]) as admin:
        for name, queues in topics.items():
            admin.create_topic(name, queues)


def read_back(spark, broker, topics: str) -> list:
    return spark.read.format("gms").option("brokers", broker.address).option("topics", topics).load().collect()


def writer(df, broker):
    return df.write.format("gms").mode("append").option("brokers", broker.address)


def test_batch_write_then_read_back_every_row(spark, broker):
    create_topics(broker, **{"sink-a": 3, "sink-b": 1})
    past_ms, future_ms = int(time.time() * 1000) - 60_000, int(time.time() * 1000) + 3_600_000
    rows = [("sink-a" if i % 3 else "sink-b", b"body-%d" % i, ("paid", "shipped", None)[i % 3],
             [f"k{i % 5}", f"id{i}"] if i % 2 else [], "route" if i % 4 == 0 else None,
             {"n": str(i)} if i % 7 else None, past_ms if i % 6 == 0 else None) for i in range(600)]
    rows.append(("sink-a", b"later", None, [], None, None, future_ms))
    writer(spark.createDataFrame(rows, SCHEMA).repartition(3), broker).save()

    back = read_back(spark, broker, "sink-a,sink-b")
    assert sorted((r.topic, bytes(r.body), r.tag, tuple(r.keys), r.properties) for r in back) == sorted(
        (topic, body, tag, (key, *keys) if key else tuple(keys), props or {})  # a key= is stored as the first key
        for topic, body, tag, keys, key, props, _ in rows[:-1])
    # The routing key pins a queue per topic; the future deliver_at is scheduled, not in the topic yet.
    routed = {(r.topic, r.queue_id) for r in back if int(bytes(r.body)[5:]) % 4 == 0}
    assert len(routed) == 2

    writer(spark.createDataFrame([("text body",)], "body string"), broker).option("topic", "sink-b").save()
    assert b"text body" in {bytes(r.body) for r in read_back(spark, broker, "sink-b")}


def test_bad_rows_fail_the_job_with_a_clear_error(spark, broker):
    create_topics(broker, **{"sink-ok": 1})
    good = spark.createDataFrame([(b"a",)], "body binary")
    with pytest.raises(Exception, match="needs a body column"):
        writer(spark.createDataFrame([("x",)], "tag string"), broker).option("topic", "sink-ok").save()
    with pytest.raises(Exception, match="topic column or the topic option"):
        writer(good, broker).save()
    with pytest.raises(Exception, match=r"not \['size'\]"):
        writer(spark.createDataFrame([(b"a", 1)], "body binary, size int"), broker).option("topic", "sink-ok").save()
    with pytest.raises(Exception, match="row 1 has no body"):
        writer(spark.createDataFrame([(b"a",), (None,)], "body binary").coalesce(1), broker).option(
            "topic", "sink-ok").save()
    with pytest.raises(Exception, match="no-such-topic"):
        writer(good, broker).option("topic", "no-such-topic").save()


def test_a_send_the_broker_refuses_fails_the_job_with_its_error(spark, broker):
    with Admin(brokers=[broker.address]) as admin:
        admin.create_topic("sink-small", 1, settings={"message_size_bytes_max": 1024})
    rows = spark.createDataFrame([(b"a",), (b"x" * 4096,), (b"b",)], "body binary").coalesce(1)
    with pytest.raises(Exception, match=r"not acknowledged.*limit of 1024 bytes"):
        writer(rows, broker).option("topic", "sink-small").save()


def test_streaming_write_commits_per_micro_batch(spark, broker, tmp_path: Path):
    create_topics(broker, **{"sink-stream": 2})
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()

    def add_file(n: int) -> None:
        (source / f"f{n}.json").write_text("".join(f'{{"body": "m{n}-{i}", "tag": "t{n}"}}\n' for i in range(50)))

    def run_once() -> list:
        query = (spark.readStream.schema("body string, tag string").option("maxFilesPerTrigger", 1).json(str(source))
                 .writeStream.format("gms").option("brokers", broker.address).option("topic", "sink-stream")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None
        return [p for p in query.recentProgress if p["numInputRows"]]

    for n in range(3):
        add_file(n)
    assert len(run_once()) == 3  # three micro-batches
    add_file(3)
    assert len(run_once()) == 1  # resumed from the checkpoint: only the new file
    back = read_back(spark, broker, "sink-stream")
    bodies = sorted(bytes(r.body).decode() for r in back)
    assert bodies == sorted(f"m{n}-{i}" for n in range(4) for i in range(50))
    assert all(r.tag == "t" + bytes(r.body).decode()[1] for r in back)


def test_streaming_read_commits_the_group_offsets(spark, broker, tmp_path: Path):
    create_topics(broker, **{"src": 2})
    address = broker.address

    def send(first: int, count: int) -> None:
        with Producer(brokers=[address]) as producer:
            for i in range(first, first + count):
                producer.send("src", b"%d" % i, queue=i % 2)

    def committed(admin: Admin) -> dict[int, int]:
        time.sleep(0.2)  # between polls
        try:
            return admin.group_describe("spark-q")["offsets"].get(address, {}).get("src", {})
        except GroupNotFoundError:  # before the first commit
            return {}

    send(0, 40)
    admin = Admin(brokers=[address])
    query = (spark.readStream.format("gms").option("brokers", address).option("topics", "src")
             .option("group", "spark-q").option("columns", "queue_offset,body").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="1 second").start())
    try:
        wait_until(lambda: committed(admin) == {0: 20, 1: 20}, QUERY_TIMEOUT_S)
        send(40, 10)
        wait_until(lambda: committed(admin) == {0: 25, 1: 25}, QUERY_TIMEOUT_S)
    finally:
        query.stop()
        admin.close()
    assert query.exception() is None
    assert spark.read.parquet(str(tmp_path / "out")).count() == 50
