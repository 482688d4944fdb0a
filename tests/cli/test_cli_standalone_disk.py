"""What the quick start costs on disk, measured as ``du`` measures it (allocated blocks, not the
files' apparent sizes): a standalone that stores a few messages takes a few MiB for its broker
store -- files get blocks as they fill, the next commitlog file comes when the active one is half
full -- and `gms cluster` reports the store's disk use as du does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from processes import FREE_MONITORING_PORTS
from test_cli_standalone import gms, read_addresses, wait_broker_registered

from gms.broker.store.disk_usage import DISK_USAGE_MAX_AGE_S

MIB = 1 << 20
BROKER_BOUND_BYTES = 16 * MIB  # was 2.1 GB: two 1 GiB commitlog files and a 56 MB key index, allocated whole
# etcd 3.5 preallocates its write-ahead log in 64 MB segments, the current one and the next (no
# setting changes that): the data dir is ~128 MB of etcd plus the broker's store.
DATA_DIR_BOUND_BYTES = 160 * MIB
DU_TOLERANCE_BYTES = 256 * 1024  # checkpoints and offsets are rewritten between the two looks


def du(path: Path) -> int:
    """``du -s --block-size=1 path``: the blocks allocated under it."""
    done = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, timeout=60,
                          check=True)
    return int(done.stdout.split()[0])


def test_a_standalone_with_a_few_messages_costs_a_few_mib_and_reports_what_du_says(tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "gms.cli", "standalone", "--data-dir", str(data), "--nameserver-port", "0",
         "--broker-port", "0", *FREE_MONITORING_PORTS],  # the default commitlog file size, as the quick start
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        nameserver = read_addresses(proc)["nameserver"]
        assert wait_broker_registered(nameserver), "the broker did not register"
        assert gms(nameserver, "topic", "create", "orders").returncode == 0
        for key in ("k1", "k2"):  # keys: the key index gets a file too
            sent = gms(nameserver, "produce", "orders", "--key", key, input=b"one\ntwo\nthree\n")
            assert sent.returncode == 0, sent.stderr
        # The broker's figure is at most DISK_USAGE_MAX_AGE_S old: an ask after that walks again.
        deadline = time.monotonic() + 3 * DISK_USAGE_MAX_AGE_S
        while True:
            status = gms(nameserver, "cluster", "--json")
            assert status.returncode == 0, status.stderr
            [broker] = json.loads(status.stdout)["brokers"]
            store = du(data / "broker" / "store")
            if abs(broker["disk_used_bytes"] - store) <= DU_TOLERANCE_BYTES or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert abs(broker["disk_used_bytes"] - store) <= DU_TOLERANCE_BYTES, (broker["disk_used_bytes"], store)
        assert du(data / "broker") < BROKER_BOUND_BYTES
        assert du(data) < DATA_DIR_BOUND_BYTES, subprocess.run(["du", "-a", str(data)], capture_output=True,
                                                              text=True, check=False).stdout
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
