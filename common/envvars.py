"""Server options from the environment, for containers and service managers.

Every option of a server command can come from a variable named after the program and the
option's long flag: ``--store-dir`` of ``gms-broker`` is ``GMS_BROKER_STORE_DIR``,
``--etcd`` of ``gms-nameserver`` is ``GMS_NAMESERVER_ETCD``, ``--broker-port`` of
``gms standalone`` is ``GMS_STANDALONE_BROKER_PORT``. Named from the flag rather than from
click's parameter name (``GMS_BROKER_FLUSH``, not ``…_FLUSH_MODE``) so the variable is the
flag a user reads in ``--help``, which lists each one.

Precedence: a flag on the command line > its variable > ``--config`` file (broker) > default.
Boolean flags take ``1/0``, ``true/false``, ``yes/no``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

CommandT = TypeVar("CommandT", bound=click.Command)


def envvar_name(prefix: str, option: click.Option) -> str:
    """``PREFIX_FLAG`` from the option's first long flag (``--auto-create-topics`` of
    ``--auto-create-topics/--no-auto-create-topics``)."""
    flag = next(opt for opt in option.opts if opt.startswith("--"))
    return f"{prefix}_{flag[2:].replace('-', '_').upper()}"


def options_from_env(prefix: str) -> Callable[[CommandT], CommandT]:
    """Decorator (above ``@click.command``): each option of the command reads
    ``{prefix}_{FLAG}`` when the flag is not given, and ``--help`` shows the variable."""

    def apply(command: CommandT) -> CommandT:
        for param in command.params:
            if isinstance(param, click.Option) and param.expose_value:
                param.envvar = envvar_name(prefix, param)
                param.show_envvar = True
        return command

    return apply
