"""One etcd watch on its own gRPC stream, delivering plain WatchBatch values (why not on pyetcd's
shared watcher: gms.cluster.etcd_client)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd.etcdrpc import kv_pb2

from gms.cluster.etcd_failures import WatchRefused
from gms.cluster.etcd_types import WatchBatch, WatchEvent, kv_of

log = logging.getLogger("gms.cluster.etcd_client")  # the adapter's one log name

class WatchStream:
    """One etcd watch on its own gRPC stream (see gms.cluster.etcd_client for why not pyetcd's).

    ``wait_created`` raises when etcd refuses the watch; after that each change goes to
    ``on_batch`` and, unless cancelled, the end of the stream to ``on_end`` once. The request
    side is half-closed right after the create request: etcd keeps the watch running."""

    def __init__(
        self,
        channel: grpc.Channel,
        request: object,
        metadata: tuple[tuple[str, str], ...] | None,
        on_batch: Callable[[WatchBatch], None],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        self._on_batch = on_batch
        self._on_end = on_end
        self._created = threading.Event()
        self._create_error: BaseException | None = None
        self._cancelled = False
        self.ended = False
        self._call = etcdrpc.WatchStub(channel).Watch(iter([request]), metadata=metadata)
        threading.Thread(target=self._run, name="gms-etcd-watch", daemon=True).start()

    def wait_created(self, timeout_s: float) -> None:
        if not self._created.wait(timeout_s):
            self.cancel()
            raise etcd_exc.WatchTimedOut()
        if self._create_error is not None:
            raise self._create_error

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def _run(self) -> None:
        ended: BaseException | None = None
        try:
            for resp in self._call:
                if not self._created.is_set():
                    if resp.canceled:
                        compacted = resp.compact_revision
                        refusal = WatchRefused(resp.cancel_reason)
                        self._fail_creation(etcd_exc.RevisionCompactedError(compacted) if compacted else refusal)
                        return
                    self._created.set()
                elif resp.compact_revision:
                    ended = etcd_exc.RevisionCompactedError(resp.compact_revision)
                    break
                elif resp.canceled:
                    ended = WatchRefused(resp.cancel_reason)
                    break
                if resp.events or not resp.created:
                    events = [WatchEvent(kv_of(ev.kv), ev.type == kv_pb2.Event.DELETE) for ev in resp.events]
                    self._deliver(self._on_batch, WatchBatch(events, resp.header.revision))
        except grpc.RpcError as err:
            ended = err
        except Exception as err:  # a bug here must still end the watch visibly
            log.exception("etcd watch stream failed")
            ended = err
        if not self._created.is_set():
            self._fail_creation(ended or etcd_exc.ConnectionFailedError())
            return
        self._call.cancel()
        self.ended = True
        if not self._cancelled:
            self._deliver(self._on_end, ended)

    def _fail_creation(self, err: BaseException) -> None:
        self.ended = True
        self._create_error = err
        self._call.cancel()
        self._created.set()

    @staticmethod
    def _deliver(callback: Callable[[Any], None], arg: object) -> None:
        try:
            callback(arg)
        except Exception:
            log.exception("etcd watch callback failed")
