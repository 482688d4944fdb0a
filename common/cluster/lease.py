"""Keep an etcd lease alive from a daemon thread, re-granting it if etcd forgot it.

Liveness in gms is "your lease is alive": broker registrations and controller candidacy hang
keys on a lease. ``on_granted(lease_id)`` (re)writes those keys; it runs at start and again
after the lease is found expired (e.g. etcd was down longer than the TTL), so a broker
re-registers by itself once etcd is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gms.cluster.errors import ClusterError
from gms.cluster.etcd_client import EtcdClient
from gms.log_throttle import Outage

log = logging.getLogger(__name__)

KEEPALIVE_FRACTION = 3  # refresh every ttl/3: two refreshes may fail before the lease lapses
RETRY_AFTER_ERROR_S = 0.2


class LeaseKeeper:
    def __init__(
        self,
        client: EtcdClient,
        ttl_s: int,
        on_granted: Callable[[int], object],
        *,
        on_lost: Callable[[], None] | None = None,
        name: str = "lease",
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"lease TTL must be >= 1 s, got {ttl_s}")
        self._client = client
        self.ttl_s = ttl_s
        self._on_granted = on_granted
        self._on_lost = on_lost
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_id = 0
        self._valid_until = 0.0  # monotonic; the lease is surely alive before this
        self._reported_alive = False
        self._outage = Outage(log, f"{name}: etcd keep-alive")

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def alive(self) -> bool:
        """True while the last successful grant/refresh guarantees the lease still exists."""
        return self._lease_id != 0 and time.monotonic() < self._valid_until

    def start(self) -> LeaseKeeper:
        """Grant and run ``on_granted`` synchronously (errors propagate), then keep alive."""
        self._grant()
        self._thread = threading.Thread(target=self._run, name=f"gms-{self._name}", daemon=True)
        self._thread.start()
        return self

    def _grant(self) -> None:
        sent = time.monotonic()
        lease_id = self._client.grant_lease(self.ttl_s)
        self._on_granted(lease_id)
        self._lease_id = lease_id
        self._valid_until = sent + self.ttl_s
        self._reported_alive = True

    def _run(self) -> None:
        interval_s = self.ttl_s / KEEPALIVE_FRACTION
        while not self._stop.wait(interval_s):
            interval_s = self.ttl_s / KEEPALIVE_FRACTION
            try:
                if self._lease_id == 0:
                    self._grant()
                    self._outage.recovered()
                    continue
                sent = time.monotonic()
                ttl_s = self._client.refresh_lease(self._lease_id)
                self._outage.recovered()
                if ttl_s > 0:
                    self._valid_until = sent + ttl_s
                    continue
                log.warning("%s: lease %x expired in etcd; re-granting", self._name, self._lease_id)
                self._lease_id = 0
                self._check_lost()
                self._grant()
            except ClusterError as err:
                self._outage.failed(err)
                self._check_lost()
                interval_s = RETRY_AFTER_ERROR_S

    def _check_lost(self) -> None:
        """Fire ``on_lost`` once per loss, as soon as the lease can no longer be vouched for."""
        if self._reported_alive and not self.alive:
            self._reported_alive = False
            if self._on_lost is not None:
                self._on_lost()

    def stop(self, *, revoke: bool = True) -> None:
        """Stop refreshing; ``revoke`` deletes the lease's keys now instead of after the TTL."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        lease_id, self._lease_id = self._lease_id, 0
        if revoke and lease_id:
            try:
                self._client.revoke_lease(lease_id)
            except ClusterError as err:
                log.warning("%s: could not revoke lease %x: %s", self._name, lease_id, err)
