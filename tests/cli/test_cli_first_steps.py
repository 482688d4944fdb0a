"""What a new user meets on the command line, against a real cluster (etcd, a nameserver and a
broker process): the quick start's commands in order, one style of error, internal topics kept
out of the way, times read one way, dead letters shown whole, and wrong addresses explained."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from gms_cluster import LocalCluster

from gms.record.layout import DELIVER_AT_PROPERTY

TIMEOUT_S = 60
FAR_FROM_UTC = "Pacific/Kiritimati"  # UTC+14: a local-time reading is 14 hours off


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = LocalCluster(tmp_path_factory.mktemp("cli-first-steps")).start(nameservers=1, brokers=1)
    try:
        yield running
    finally:
        running.stop()


def gms(cluster: LocalCluster, *args: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-P", "-m", "gms.cli", *args], capture_output=True, text=True,
                         env={**os.environ, "GMS_NAMESERVER": cluster.nameserver, **env}, timeout=TIMEOUT_S,
                         check=False)
    assert "Traceback" not in out.stderr, out.stderr
    assert (out.returncode == 0) == ok, (out.returncode, out.stdout, out.stderr)
    return out


@pytest.fixture
def topic(cluster) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    gms(cluster, "topic", "create", name, "--queues", "2")
    return name


def sent_id(produced: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(produced.stdout)["results"][0]["msg_id"])


# --- times ---------------------------------------------------------------------------------------


def test_deliver_at_reads_a_time_as_every_other_option_does(cluster, topic):
    """`--deliver-at` takes epoch ms, `…Z`, `+hh:mm`, and a time without a zone is UTC, whatever
    the machine's zone (it used to read local time and refuse the other two spellings)."""
    at_s = int(time.time()) + 3600  # whole seconds: every spelling can say it
    at_ms = at_s * 1000
    at = datetime.datetime.fromtimestamp(at_s, datetime.UTC).replace(tzinfo=None).isoformat()
    plus_one = datetime.datetime.fromtimestamp(at_s, datetime.timezone(datetime.timedelta(hours=1))).isoformat()
    for spelling in (str(at_ms), f"{at}Z", at, plus_one):
        produced = gms(cluster, "produce", topic, "later", "--deliver-at", spelling, "--json", TZ=FAR_FROM_UTC)
        shown = json.loads(gms(cluster, "msg", "show", sent_id(produced), "--json").stdout)
        assert shown["properties"][DELIVER_AT_PROPERTY] == str(at_ms), spelling
    refused = gms(cluster, "produce", topic, "x", "--deliver-at", "tomorrowish", ok=False)
    assert refused.returncode == 2 and "without a zone is UTC" in refused.stderr
