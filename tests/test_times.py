"""Times typed by people mean the same instant in the CLI and in Spark options."""

import pytest

from gms.times import parse_time_ms

NOON_UTC_MS = 1_795_435_200_000  # 2026-11-23T12:00:00Z


@pytest.mark.parametrize("text", [
    "2026-11-23T12:00:00", "2026-11-23T12:00:00Z", "2026-11-23T13:00:00+01:00", "2026-11-23 12:00",
    str(NOON_UTC_MS),
])
def test_one_instant_many_spellings(text):
    assert parse_time_ms(text) == NOON_UTC_MS


def test_date_only_is_midnight_utc():
    assert parse_time_ms("2026-11-23") == NOON_UTC_MS - 12 * 3600 * 1000


def test_bad_time_names_the_rule():
    with pytest.raises(ValueError, match="without a zone is UTC"):
        parse_time_ms("yesterday")
