"""Every path a broker keeps on disk, named in one place::

    <--store-dir>/store/                       the message store (StorePaths.root)
        commitlog/<20-digit start offset>      shared mapped files, all topics
        consumequeue/<topic>/<queue id>/<20-digit byte offset>   20-byte index entries
        index/<20-digit commitlog offset>      key index files (hash slots + chained entries)
        compacted/<topic>/<queue id>/<20-digit point>.seg   a compacted queue's kept records below its point
        config/topics.json                     topic -> queue count, limits, incarnation
        config/layout.json                     the geometry the store was created with
        config/min_offsets.json                queue minimums moved by per-topic retention
        config/truncations.json                queue cuts made by a replica following a new leader
        config/consumer_offsets.json           committed consumer-group offsets
        config/replication.json                replication epochs and high watermarks
        checkpoint                             where crash recovery starts
        abort                                  exists while the store is open (an unclean stop leaves it)

Readers of a store (Spark jobs, ``gms standalone``) take the same names from here. Every file is
created 0600 and every directory 0700 (``gms.private_files``): only the broker's user reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BROKER_STORE_SUBDIR = "store"  # gms-broker --store-dir DIR keeps its store in DIR/store
CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"


@dataclass(frozen=True, slots=True)
class StorePaths:
    root: Path

    @classmethod
    def of_broker(cls, store_dir: str | Path) -> StorePaths:
        """The store of a broker started with ``--store-dir store_dir``."""
        return cls(Path(store_dir) / BROKER_STORE_SUBDIR)

    @property
    def commitlog(self) -> Path:
        return self.root / "commitlog"

    @property
    def consumequeue(self) -> Path:
        return self.root / "consumequeue"

    @property
    def key_index(self) -> Path:
        """The index by message key (gms.broker.keyindex), files named by their first record's offset."""
        return self.root / "index"

    @property
    def compacted(self) -> Path:
        """Compacted topics' logs: ``<topic>/<queue id>/<20-digit compaction point>.seg``."""
        return self.root / "compacted"

    def queue_dir(self, topic: str, queue_id: int) -> Path:
        return self.consumequeue / topic / str(queue_id)

    @property
    def config(self) -> Path:
        return self.root / "config"

    @property
    def topics(self) -> Path:
        return self.config / "topics.json"

    @property
    def layout(self) -> Path:
        return self.config / "layout.json"

    @property
    def identity(self) -> Path:
        """The broker's name, its identity in the cluster (gms.broker.identity)."""
        return self.config / "broker.json"

    @property
    def min_offsets(self) -> Path:
        return self.config / "min_offsets.json"

    @property
    def truncations(self) -> Path:
        return self.config / "truncations.json"

    @property
    def consumer_offsets(self) -> Path:
        return self.config / "consumer_offsets.json"

    @property
    def replication_state(self) -> Path:
        return self.config / "replication.json"

    @property
    def timers(self) -> Path:
        """Per queue, where a restart rescans for undelivered scheduled messages (broker.timers)."""
        return self.config / "timers.json"

    @property
    def origins(self) -> Path:
        """Where replicated records lay on their leaders (broker.origins)."""
        return self.root / "origins"

    @property
    def producers(self) -> Path:
        """The idempotent producers' last batches per queue, as of the checkpoint (broker.producer_state)."""
        return self.config / "producers.snapshot"

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT_FILE

    @property
    def abort(self) -> Path:
        return self.root / ABORT_FILE
