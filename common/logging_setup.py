"""Where and how ``gms-broker`` and ``gms-nameserver`` log: one set of flags for both.

- ``--log-format text`` (a line per record) or ``json`` (an object per line: ``time``, ``level``,
  ``logger``, ``message``, ``exception`` when there is one, and the fields a record was given
  with ``extra=``, such as the ``request_id`` and ``peer`` of a failed request);
- ``--log-file PATH``, rotated by size (``--log-file-max-bytes``, ``--log-file-backups``
  older files kept as ``PATH.1``...); stderr without it;
- the same warning or error at most once a minute, with a count of those not shown
  (:class:`gms.log_throttle.RepeatFilter`); info and debug lines all pass, as a failover's
  line per queue must, and so does the audit trail (``gms.audit``).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from gms.log_throttle import RepeatFilter
from gms.security.gate import audit

F = TypeVar("F", bound=Callable[..., Any])

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A day of a busy broker's info lines is a few MiB: 100 MiB x 6 files bounds the disk a log takes.
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5

# What every LogRecord has; anything else on a record came through ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a message's newlines are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update((key, value) for key, value in vars(record).items() if key not in _RECORD_ATTRIBUTES)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class RepeatedWarningFilter(RepeatFilter):
    """:class:`RepeatFilter` for warnings and errors only, never for the audit trail: each
    refused request is a line of its own (who, from where, what)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or record.name == audit.name or super().filter(record)


def configure_logging(level: str, fmt: str, file: Path | None, max_bytes: int, backups: int) -> None:
    """Send every logger's records at ``level`` (a :data:`LEVELS` name) and above to ``file``
    (rotated past ``max_bytes``, keeping ``backups`` old files) or stderr, as ``fmt`` text or
    json. Replaces whatever handlers the root logger had."""
    handler: logging.Handler
    if file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.handlers.RotatingFileHandler(file, maxBytes=max_bytes, backupCount=backups,
                                                       encoding="utf-8")
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RepeatedWarningFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


_OPTIONS = (
    click.option("--log-level", type=click.Choice(LEVELS), default="info", help="The least severe level logged."),
    click.option("--log-format", type=click.Choice(FORMATS), default="text",
                 help="text: a line per record; json: an object per line (time, level, logger, message, exception,"
                      " request_id...)."),
    click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path),
                 help="Log to this file instead of stderr, rotated by size."),
    click.option("--log-file-max-bytes", type=click.IntRange(min=1), default=DEFAULT_MAX_BYTES,
                 help="Rotate --log-file when it would grow past this."),
    click.option("--log-file-backups", type=click.IntRange(min=0), default=DEFAULT_BACKUPS,
                 help="Rotated files kept (FILE.1 the newest)."),
)
# Each option's parameter name and the configure_logging argument it is.
_ARGUMENTS = {"log_level": "level", "log_format": "fmt", "log_file": "file", "log_file_max_bytes": "max_bytes",
              "log_file_backups": "backups"}


def log_options(command: F) -> F:
    """Stack the log flags on ``command`` (below ``@click.command``)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def configure_logging_from(kwargs: dict[str, Any]) -> None:
    """Take the log flags out of a command's keyword arguments and apply them; a log file that
    cannot be opened is a usage error."""
    values = {argument: kwargs.pop(name) for name, argument in _ARGUMENTS.items()}
    try:
        configure_logging(**values)
    except OSError as err:
        raise click.UsageError(f"cannot open --log-file {values['file']}: {err.strerror}") from err
