"""Storage invariants are checks that raise StoreInvariantBroken, not asserts: ``python -O``
(which drops asserts) keeps them, and the write that would break one stops before it writes."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys, tempfile
from pathlib import Path
from gms.broker.consumequeue.consume_queue import ConsumeQueue
from gms.broker.segment_list import SegmentList
from gms.store_errors import StoreInvariantBroken

broken = []
with tempfile.TemporaryDirectory() as tmp:
    cq = ConsumeQueue(Path(tmp) / "cq", 4)
    cq.reserve(2)
    for name, call in [("write_one past the end", lambda: cq.write_one(1, 0, 10, 0)),
                       ("publish below the end", lambda: (cq.write_one(0, 0, 10, 0), cq.publish(1), cq.publish(0))),
                       ("a file that does not follow", lambda: cq._segments.append(cq._segments.create(160)))]:
        try:
            call()
        except StoreInvariantBroken:
            broken.append(name)
    cq.close()
print(sys.flags.optimize, len(broken))
"""


def test_invariants_hold_under_python_dash_o():
    out = subprocess.run([sys.executable, "-O", "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "3"]
