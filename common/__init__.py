"""gms: a distributed message queue.

The repository's top-level folders (``broker/``, ``client/``, ``cli/``,
``nameserver/``, ``spark_jobs/``) install as subpackages of this namespace;
this package itself holds what all of them share: the record format, the
wire protocol and the error types.
"""

__version__ = "0.1.0"
