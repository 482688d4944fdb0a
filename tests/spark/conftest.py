"""One local Spark session for the whole Spark suite, and stores written by the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from spark_store_helpers import write_store


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from gms.spark_jobs import register

    session = (SparkSession.builder.master("local[2]").appName("gms-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.gms_corrupt = register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> tuple[Path, list]:
    """A broker store dir (DIR/store) with topics orders (4 queues), empty (2), many (40 small)."""
    base = tmp_path_factory.mktemp("spark-store")
    return base, write_store(base / "store")
