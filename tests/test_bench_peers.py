"""The side-by-side benchmark (``benchmarks/bench_peers.py``): a short gms-only run through
``gms standalone`` and the public SDK prints every gms figure and no ratio (peers are never
needed by the tests), and ratios name the best peer the right way round."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_peers.py"
RUN_TIMEOUT_S = 240


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_peers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratios_against_the_best_peer():
    bench = _bench_module()
    gms = {"w1_produce_msgs_per_s": 300.0, "w3_p50_us": 90.0, "w3_p50_us_runs": [90.0],
           "w1_produce_cpu_client_pct": 50.0}
    peers = {"redis": {"w1_produce_msgs_per_s": 100.0, "w3_p50_us": 60.0},
             "nats": {"w1_produce_msgs_per_s": 150.0, "w3_p50_us": 120.0}}
    assert bench.ratios(gms, peers) == {
        "ratio_w1_produce_msgs_per_s": 2.0, "best_peer_w1_produce_msgs_per_s": "nats",  # the fastest
        "ratio_w3_p50_us": 1.5, "best_peer_w3_p50_us": "redis",  # the lowest latency
    }
    assert bench.ratios(gms, {}) == {}


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_peers_quick_gms_only():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--reps", "1", "--peers", "none"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    for workload in ("w1", "w2"):
        for figure in ("produce_msgs_per_s", "consume_msgs_per_s"):
            assert result[f"{workload}_{figure}"] > 0, result
    assert 0 < result["w3_p50_us"] <= result["w3_p99_us"] <= result["w3_p999_us"], result
    assert not [key for key in result if key.startswith("ratio_")], result
