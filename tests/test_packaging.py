"""The repository's folders install under the ``gms`` namespace only."""

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    ["gms.broker.commitlog", "gms.broker.consumequeue", "gms.broker.ha", "gms.client",
     "gms.cli", "gms.nameserver", "gms.spark_jobs", "gms.protocol"],
)
def test_subpackages_import_under_gms(module):
    assert importlib.import_module(module).__name__ == module


@pytest.mark.parametrize("bare", ["client", "cli", "broker", "nameserver", "spark_jobs"])
def test_no_bare_top_level_modules(bare, tmp_path):
    # A fresh interpreter outside the repository sees only what is installed.
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({bare!r}) is not None)"
    assert subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path).returncode == 0
