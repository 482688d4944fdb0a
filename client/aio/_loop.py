"""The loop an asyncio client runs on: the caller's."""

from __future__ import annotations

import asyncio


def running_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running loop, which the client ``what`` is bound to; a clear error outside of one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"create {what} inside a coroutine: it runs on the caller's event loop") from None
