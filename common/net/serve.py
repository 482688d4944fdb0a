"""Running a server process in the foreground: signals, the port file, clean stop.

SIGTERM or SIGINT stops the server cleanly (its ``stop()`` flushes and checkpoints); a second
signal exits at once. Shared by ``gms-broker`` and ``gms-nameserver``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gms.private_files import write_private


class Server(Protocol):
    @property
    def port(self) -> int: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def write_port_file(path: Path, port: int) -> None:
    """Atomically publish the bound port (scripts and tests wait for this file), in a file only
    its owner may read, like the logs beside it in a standalone data dir."""
    tmp = path.with_suffix(".tmp")
    write_private(tmp, str(port).encode())
    tmp.replace(path)


async def serve_until_signalled(
    server: Server,
    name: str,
    log: logging.Logger,
    *,
    port_file: Path | None = None,
    start_error: Callable[[BaseException], str | None] = lambda err: None,
    started: Callable[[], str] = lambda: "serving",
) -> int:
    """Start ``server``, serve until SIGTERM/SIGINT, stop it; the process exit code.

    ``start_error(err)`` turns an exception from ``start()`` into the message to log (exit 1),
    or returns None to let it propagate."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        if stop.is_set():
            log.warning("second %s: exiting without a clean stop", signame)
            os._exit(1)  # children started with a death signal go with us
        log.info("%s received: stopping (send it again to force)", signame)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        await server.start()
    except Exception as err:
        message = start_error(err)
        if message is None:
            raise
        log.error("%s", message)
        return 1
    if port_file is not None:
        write_port_file(port_file, server.port)
    log.info("%s", started())
    await stop.wait()
    await server.stop()
    log.info("%s stopped cleanly", name)
    return 0
