"""The fault benchmark (``benchmarks/bench_faults.py``) in a short run: two rounds of random
faults (SIGKILL, SIGSTOP, a bit flip in a stopped broker's commitlog) against a sync-flush broker
and against a 3-broker acks=-1 cluster, then every queue read back through the SDK. No
acknowledged message is lost, no offset holds two messages, no damage is served as data and
every broker restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_faults.py"
RUN_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bench_faults_quick_two_rounds():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--rounds", "2", "--seed", "7"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-5000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    summary = f"{result}\n{done.stderr[-5000:]}"
    assert result["rounds"] == 4, summary
    assert result["acked"] > 0, summary
    assert result["lost"] == 0, summary
    assert result["dup_offsets"] == 0, summary
    assert result["corrupt_served"] == 0, summary
    assert result["broker_restarts_refused"] == 0, summary
