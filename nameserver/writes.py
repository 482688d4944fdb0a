"""Writes to the cluster's metadata: an etcd round trip off the event loop (etcd unreachable is
the client's SERVICE_UNAVAILABLE), then read-your-writes: the handler waits (briefly) until this
nameserver's own view shows the write, so a client that creates a topic and then asks the same
nameserver for its route finds it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gms.cluster.cluster_view import ClusterView
from gms.cluster.errors import EtcdUnavailable
from gms.cluster.metadata import ClusterMetadata
from gms.errors import ServiceUnavailableError

log = logging.getLogger(__name__)

VIEW_CATCH_UP_TIMEOUT_S = 2.0  # read-your-writes wait; the write already succeeded in etcd


class MetadataWrites:
    """The write path the nameserver's admin handlers share. ``metadata`` and ``view`` answer the
    started nameserver's (ServiceUnavailableError / RuntimeError before it starts)."""

    def __init__(self, etcd_endpoints: str, metadata: Callable[[], ClusterMetadata],
                 view: Callable[[], ClusterView]) -> None:
        self._etcd_endpoints = etcd_endpoints
        self.metadata = metadata
        self.view = view
        self._loop: asyncio.AbstractEventLoop | None = None
        self._view_changed = asyncio.Event()

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the handlers wait on (:meth:`view_changed` wakes them there)."""
        self._loop = loop

    async def write(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` (an etcd round trip) on a worker thread; ``what`` names it in the error."""
        try:
            return await asyncio.to_thread(fn)
        except EtcdUnavailable as err:
            raise self.unavailable(what) from err

    def unavailable(self, what: str) -> ServiceUnavailableError:
        return ServiceUnavailableError(
            f"cannot {what}: etcd ({self._etcd_endpoints}) is unreachable; topic changes need"
            " etcd, existing routes are still served. Retry once etcd is back.")

    async def until_view(self, holds: Callable[[], bool]) -> None:
        """Wait until this nameserver's view reflects a write that etcd already accepted."""
        try:
            async with asyncio.timeout(VIEW_CATCH_UP_TIMEOUT_S):
                while not holds():
                    await self._view_changed.wait()
        except TimeoutError:
            log.warning("view did not catch up with a write within %s s", VIEW_CATCH_UP_TIMEOUT_S)

    def view_changed(self) -> None:
        """The view changed (called on the watch thread): wake the waiting handlers."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:
                pass  # the loop closed between the check and the call: nobody is waiting

    def _wake(self) -> None:
        event, self._view_changed = self._view_changed, asyncio.Event()
        event.set()
