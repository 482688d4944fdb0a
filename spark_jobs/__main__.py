"""``python -m gms.spark_jobs <job> ...``: the same commands as ``gms spark``."""

from gms.spark_jobs.cli import spark

spark(prog_name="gms spark")
