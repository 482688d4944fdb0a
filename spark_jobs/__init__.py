"""PySpark data source and jobs over the gms log."""
