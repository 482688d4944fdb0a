"""PySpark data source and jobs over the gms log (needs the ``spark`` extra: ``pip install '.[spark]'``
in the checkout).

``register(spark)`` adds the ``gms`` format (read and write) to a session; the jobs live in
``gms.spark_jobs.jobs`` and behind the ``gms.spark_jobs.cli`` click group.
"""

from gms.spark_jobs.datasource import GmsDataSource, register, rows_written

__all__ = ["GmsDataSource", "register", "rows_written"]
