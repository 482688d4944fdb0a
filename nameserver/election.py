"""Leader election on etcd as in GMS: each candidate puts a key under a lease; the key with the
lowest create revision leads. A candidate that loses its lease (crash, partition from etcd) is
out once the TTL passes; it steps down itself as soon as it can no longer vouch for its lease,
which is no later than etcd expiring it, so two leaders never overlap by the lease's account.

The create revision of the leader's key is its *epoch*: revisions only grow, so every later
leader has a larger one. And since a key with a lower create revision can never appear later,
"my key still exists with the create revision I wrote" means "I still lead": :meth:`fence`
returns that compare for a leader to put into its etcd transactions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gms.cluster.errors import ClusterError
from gms.cluster.etcd_client import CreateRevisionIs, EtcdClient, WatchBatch
from gms.cluster.lease import LeaseKeeper
from gms.cluster.metadata import DEFAULT_PREFIX, Keys

log = logging.getLogger(__name__)

DEFAULT_ELECTION_TTL_S = 10
RETRY_S = 0.2


class Election:
    def __init__(
        self,
        client: EtcdClient,
        name: str,
        candidate_id: str,
        *,
        ttl_s: int = DEFAULT_ELECTION_TTL_S,
        prefix: str = DEFAULT_PREFIX,
        on_gain: Callable[[], None] | None = None,
        on_loss: Callable[[], None] | None = None,
    ) -> None:
        self._client = client
        self._dir = f"{Keys(prefix).election}{name}/"
        self.candidate_id = candidate_id
        self._on_gain = on_gain
        self._on_loss = on_loss
        self._candidacy: CreateRevisionIs | None = None  # my key and its create revision
        self._leader_id: str | None = None
        self._leader_epoch = 0
        self._is_leader = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._keeper = LeaseKeeper(
            client, ttl_s, self._campaign, on_lost=self._wake.set, name=f"election-{name}"
        )

    @property
    def is_leader(self) -> bool:
        return self._is_leader and self._keeper.alive

    @property
    def leader_id(self) -> str | None:
        """The current leader's candidate id as last seen (None if unknown)."""
        return self._leader_id

    @property
    def leader_epoch(self) -> int:
        """The current leader's epoch (its key's create revision) as last seen; 0 if unknown."""
        return self._leader_epoch

    @property
    def epoch(self) -> int:
        """This candidate's epoch: its key's create revision (0 before the first campaign)."""
        candidacy = self._candidacy
        return candidacy.create_revision if candidacy is not None else 0

    @property
    def lease_id(self) -> int:
        return self._keeper.lease_id

    def fence(self) -> CreateRevisionIs | None:
        """A txn compare that holds only while this candidate's key (hence leadership, once
        gained) is still the one it created; None before the first campaign."""
        return self._candidacy

    def start(self) -> Election:
        self._keeper.start()
        self._thread = threading.Thread(target=self._run, name="gms-election", daemon=True)
        self._thread.start()
        return self

    def close(self, *, resign: bool = True) -> None:
        """``resign`` revokes the lease so the next candidate takes over at once."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._keeper.stop(revoke=resign)
        self._set_leader(False)

    def _campaign(self, lease_id: int) -> None:
        key = f"{self._dir}{lease_id:x}"
        # A fresh key (named by a new lease), so the put's revision is its create revision.
        revision = self._client.put(key, self.candidate_id.encode(), lease_id=lease_id)
        self._candidacy = CreateRevisionIs(key, revision)
        self._wake.set()

    def _run(self) -> None:
        watch_id: int | None = None
        broken = threading.Event()
        broken.set()

        def on_watch(resp: WatchBatch | Exception) -> None:
            if isinstance(resp, Exception):
                broken.set()
            self._wake.set()

        while not self._stop.is_set():
            # Woken by watch events and lease loss; the timed wait only re-checks lease validity.
            self._wake.wait(self._keeper.ttl_s / 3)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if broken.is_set():
                    broken.clear()
                    snapshot = self._client.get_prefix(self._dir)
                    watch_id = self._client.watch_prefix(self._dir, snapshot.revision + 1, on_watch)
                kvs = self._client.get_prefix(self._dir).kvs
            except ClusterError as err:
                log.warning("election %s: %s", self._dir, err)
                broken.set()
                self._set_leader(False)
                self._stop.wait(RETRY_S)
                self._wake.set()
                continue
            first = min(kvs, key=lambda kv: kv.create_revision, default=None)
            self._leader_id = first.value.decode() if first is not None else None
            self._leader_epoch = first.create_revision if first is not None else 0
            candidacy = self._candidacy
            self._set_leader(
                first is not None
                and candidacy is not None
                and first.key.decode() == candidacy.key
                and self._keeper.alive
            )
        if watch_id is not None:
            try:
                self._client.cancel_watch(watch_id)
            except ClusterError:
                pass

    def _set_leader(self, leader: bool) -> None:
        if leader == self._is_leader:
            return
        self._is_leader = leader
        callback = self._on_gain if leader else self._on_loss
        if callback is not None:
            callback()
