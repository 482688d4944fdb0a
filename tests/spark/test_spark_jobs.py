"""Each job once on a small store (in the shared session: --master is left to it)."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner
from spark_store_helpers import ORDERS, broker_on_copy

from gms.client import Admin
from gms.spark_jobs.cli import spark as spark_group


def run(args: list[str]) -> str:
    result = CliRunner().invoke(spark_group, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_topic_stats_lag_and_export(spark, store, tmp_path):
    base, sent = store
    run(["topic-stats", "--store", str(base), "--topics", "orders", "--bucket", "hour",
         "--output", str(tmp_path / "stats"), "--top-keys", "3"])
    buckets = spark.read.parquet(str(tmp_path / "stats" / "buckets"))
    assert buckets.groupBy().sum("messages").first()[0] == ORDERS
    assert {r.tag for r in buckets.select("tag").distinct().collect()} == {"created", "paid", None}
    keys = spark.read.parquet(str(tmp_path / "stats" / "keys")).collect()
    assert len(keys) == 3 and keys[0].messages == max(sum(f"k{j}" in m.keys for m in sent) for j in range(7))

    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    offsets = {"version": 1, "offsets": {"billing": {"orders": {"0": 300, "1": 290}}}}
    (copy / "store" / "config" / "consumer_offsets.json").write_text(json.dumps(offsets))
    run(["lag", "--store", str(copy), "--output", str(tmp_path / "lag")])
    lag = {(r.queue_id): r for r in spark.read.parquet(str(tmp_path / "lag")).collect()}
    assert (lag[0].lag, lag[0].oldest_age_ms) == (0, None)
    assert lag[1].lag == 10 and lag[1].max_offset == 300 and lag[1].oldest_age_ms >= 0

    out = tmp_path / "export"
    run(["export", "--store", str(base), "--topics", "orders", "--tags", "paid", "--output", str(out)])
    exported = spark.read.parquet(str(out))
    assert exported.count() == sum(m.tag == "paid" for m in sent)
    assert any(p.name.startswith("date=") for p in (out / "topic=orders").iterdir())


def test_replay_into_another_topic(spark, store, tmp_path, broker_factory):
    base, sent = store
    broker = broker_on_copy(base, tmp_path, broker_factory)
    with Admin(brokers=[broker.address]) as admin:
        admin.create_topic("retry", 2)
    output = run(["replay", "--brokers", broker.address, "--topics", "orders", "--tags", "created",
                  "--to-topic", "retry", "--to-brokers", broker.address])
    created = [m for m in sent if m.tag == "created"]
    assert f"replayed {len(created)}" in output
    copied = spark.read.format("gms").option("brokers", broker.address).option("topics", "retry").load().collect()
    assert sorted((bytes(r.body), tuple(r.keys), r.tag) for r in copied) == sorted(
        (m.body, tuple(m.keys), m.tag) for m in created)
