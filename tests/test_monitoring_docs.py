"""docs/monitoring's Grafana dashboard and Prometheus alert rules are well formed and name only
metrics a real nameserver and broker export (a renamed metric would leave a blank panel or an
alert that never fires)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from gms_cluster import LocalCluster
from processes import NameserverProcess, free_port
from prometheus_client.parser import text_string_to_metric_families
from scrape import get

from gms.client import Admin, Consumer, Producer, ProducerRecord

pytestmark = pytest.mark.timeout(90)

DOCS = Path(__file__).parent.parent / "docs" / "monitoring"
METRIC = re.compile(r"\bgms_[a-z_]+")


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)
    variables = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return [t["expr"] for p in panels for t in p["targets"]] + variables


def alert_exprs() -> list[str]:
    rules = [r for g in yaml.safe_load((DOCS / "prometheus-alerts.yml").read_text())["groups"] for r in g["rules"]]
    assert rules
    for rule in rules:
        assert rule["alert"].startswith("Gms") and rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    return [r["expr"] for r in rules]


def exported(port: int) -> set[str]:
    status, text = get(port, "/metrics")
    assert status == 200
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def test_dashboard_and_alerts_name_only_exported_metrics(tmp_path):
    cluster = LocalCluster(tmp_path)
    cluster.etcd.start()
    try:
        ns_port = free_port()
        broker_port = free_port(avoid=ns_port)
        nameserver = NameserverProcess(tmp_path / "ns", cluster.etcd.endpoint,
                                       ["--metrics-listen", f"127.0.0.1:{ns_port}"])
        cluster.nameservers.append(nameserver)
        nameserver.start()
        cluster.add_broker("--metrics-listen", f"127.0.0.1:{broker_port}")
        cluster.wait_registered(1)
        with Admin(nameserver=cluster.nameserver) as admin:
            admin.create_topic("dash", queues=1)
        with Producer(nameserver=cluster.nameserver) as producer:
            producer.send_batch([ProducerRecord("dash", b"x")] * 10)
        consumer = Consumer(nameserver=cluster.nameserver, group="dashboards", subscription={"dash": "*"},
                            start_from="first")
        try:
            assert consumer.poll(5000)
            consumer.commit()
        finally:
            consumer.close()
        names = exported(ns_port) | exported(broker_port)
        referenced = {m for expr in dashboard_exprs() + alert_exprs() for m in METRIC.findall(expr)}
        assert referenced, "the dashboard and the rules name gms metrics"
        assert referenced - names == set()
    finally:
        cluster.stop()
