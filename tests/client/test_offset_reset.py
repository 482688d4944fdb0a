"""The pure rules of an offset reset: each mode's target, clamped to the readable range."""

from __future__ import annotations

import pytest

from gms.client.offset_reset import ResetSpec, new_offset

RANGE = {"min_offset": 10, "max_offset": 50}


@pytest.mark.parametrize("spec, committed, expected", [
    (ResetSpec.earliest(), 30, 10),
    (ResetSpec.latest(), 30, 50),
    (ResetSpec.to_offset(20), None, 20),
    (ResetSpec.to_offset(5), 30, 10),  # below min: clamped up
    (ResetSpec.to_offset(99), 30, 50),  # beyond the end: clamped down
    (ResetSpec.shift_by(-5), 30, 25),
    (ResetSpec.shift_by(-25), 30, 10),
    (ResetSpec.shift_by(100), 30, 50),
    (ResetSpec.shift_by(-5), None, None),  # nothing committed: nothing to shift, left alone
])
def test_targets_clamp_to_the_readable_range(spec, committed, expected):
    assert new_offset(spec, committed=committed, **RANGE) == expected


def test_datetime_uses_the_offset_the_broker_found():
    spec = ResetSpec.to_datetime(1_700_000_000_000)
    assert new_offset(spec, committed=None, offset_for_time=42, **RANGE) == 42
    assert new_offset(spec, committed=None, offset_for_time=3, **RANGE) == 10
    with pytest.raises(ValueError, match="offset the broker found"):
        new_offset(spec, committed=None, **RANGE)
