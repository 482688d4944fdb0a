"""The ``gms`` command-line tool."""
