"""Fault-injection tests against real processes. The replication ones reuse the HA test helpers
(``tests/ha/ha_helpers.py``), put on the import path here as pytest puts a test's own folder."""

from __future__ import annotations

import sys
from pathlib import Path

HA_TESTS = str(Path(__file__).resolve().parent.parent / "ha")
if HA_TESTS not in sys.path:
    sys.path.insert(0, HA_TESTS)
