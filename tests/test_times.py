"""Times typed by people mean the same instant in the CLI and in Spark options."""

import time

import click
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


SPELLINGS = ["2026-11-23T12:00:00", "2026-11-23T12:00:00Z", "2026-11-23T14:00:00+02:00",
             "2026-11-23T07:00:00-05:00", str(NOON_UTC_MS)]


@pytest.mark.parametrize("text", SPELLINGS)
def test_cli_and_spark_read_a_time_alike(text, monkeypatch):
    """`gms tail --from` and Spark's startTime/endTime give the same instant, whatever the local
    zone (a zone far from UTC makes a local-time reading fail)."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")  # UTC+14
    time.tzset()
    try:
        options = pytest.importorskip("gms.spark_jobs.options")
        from gms.cli.messages import StartFrom

        parsed = options.parse_options({"path": "/store", "startTime": text, "endTime": text})
        assert StartFrom().convert(text, None, None) == NOON_UTC_MS
        assert parsed.start_time_ms == parsed.end_time_ms == NOON_UTC_MS
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_cli_and_spark_refuse_a_bad_time_with_the_rule():
    options = pytest.importorskip("gms.spark_jobs.options")
    from gms.cli.messages import StartFrom

    with pytest.raises(click.BadParameter, match="without a zone is UTC"):
        StartFrom().convert("noonish", None, None)
    with pytest.raises(options.OptionError, match=r"startTime: .*without a zone is UTC"):
        options.parse_options({"path": "/store", "startTime": "noonish"})
