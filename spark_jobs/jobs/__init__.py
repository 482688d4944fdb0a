"""Jobs over the gms log: topic-stats, lag, export, replay. Each module has ``main(argv)`` and
runs with ``python -m gms.spark_jobs.jobs.<module>`` or ``spark-submit <module file>``."""
