"""The index by message key (RocketMQ's IndexFile): hash slots and chained entries in fixed-size
files, built as records are stored, rebuilt by recovery, deleted with retention."""

from gms.broker.keyindex.index_file import IndexFile
from gms.broker.keyindex.key_index import TIME_MAX_MS, KeyIndex
from gms.broker.keyindex.keys import RecordKeys, batch_keys, key_hash, keys_field

__all__ = ["TIME_MAX_MS", "IndexFile", "KeyIndex", "RecordKeys", "batch_keys", "key_hash", "keys_field"]
