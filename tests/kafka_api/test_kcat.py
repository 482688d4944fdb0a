"""kcat (Debian's kafkacat, librdkafka's command-line client) against gms's Kafka API: it lists
the cluster, produces keyed messages with a header and reads them back; confluent-kafka reads what
it produced. Skipped where kcat is not installed (.ci/run installs it when it runs as root)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.kafka_api.test_kafka_clients import consume

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (Debian: apt-get install kafkacat)")
TIMEOUT_S = 60


def kcat(*args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_lists_produces_and_consumes(bootstrap, topic):
    listed = json.loads(kcat("-b", bootstrap, "-L", "-J", "-t", topic))
    assert [t["topic"] for t in listed["topics"]] == [topic]
    kcat("-b", bootstrap, "-t", topic, "-P", "-p", "0", "-K", ":", "-H", "gms.tag=T", stdin="k1:v1\nk2:v2\n")
    read = kcat("-b", bootstrap, "-t", topic, "-C", "-p", "0", "-o", "beginning", "-c", "2", "-e",
                "-f", "%k=%s %h\n")
    assert read.splitlines() == ["k1=v1 gms.tag=T", "k2=v2 gms.tag=T"]
    assert [(m.key(), m.value(), m.headers()) for m in consume(bootstrap, topic, 0, 2)] == [
        (b"k1", b"v1", [("gms.tag", b"T")]), (b"k2", b"v2", [("gms.tag", b"T")])]
