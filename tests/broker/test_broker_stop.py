"""A graceful stop (SIGTERM) ends promptly whatever the broker's background work is doing, on a
busy machine too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest
from processes import BrokerProcess

# The stop takes well under a second here; CI's failover tests allow 15 s (tests/processes.py).
STOP_WITHIN_S = 8.0
COMMITLOG_FILE_SIZE_BYTES = 256 << 20  # warmed at 4 MiB a look: many looks left when the stop comes


@contextmanager
def busy_cpu():
    """Children started inside run on one CPU, which a busy loop (a process of their own
    priority) keeps busy: a thread there that runs only on an idle CPU gets next to no time."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # this thread's children inherit it
    hog = None
    try:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        yield
    finally:
        os.sched_setaffinity(0, before)
        if hog is not None:
            hog.kill()
            hog.wait()


def test_a_broker_stops_promptly_while_its_commitlog_warmer_gets_no_cpu(tmp_path):
    """The commitlog's warmer pre-faults the active file from the start on a thread that runs
    only on an idle CPU (SCHED_IDLE). A broker stopped shortly after its start (a failover's
    restart) on a busy machine is still warming: its stop waited for the warmer, over 60 s here
    (CI: the HA failover tests' final stops took over 15 s)."""
    broker = BrokerProcess(tmp_path / "broker", ["--commitlog-file-size", str(COMMITLOG_FILE_SIZE_BYTES)])
    with busy_cpu():
        broker.start()
        broker.proc.send_signal(signal.SIGTERM)
        try:
            code = broker.proc.wait(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            broker.kill()
            pytest.fail(f"the broker did not stop within {STOP_WITHIN_S} s of SIGTERM: {broker.log_tail()}")
    assert code == 0, broker.log_tail()
    assert "stopped cleanly" in broker.log_tail()
