"""A store keeps the file geometry it was created with."""

import pytest

from gms.broker.store import MessageStore
from gms.broker.store_config import StoreConfig
from gms.record import encode_record
from gms.store_errors import StoreLayoutMismatch

SMALL = StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=100)


def test_reopening_with_another_file_size_is_refused_and_keeps_the_data(tmp_path):
    with MessageStore(tmp_path, SMALL) as store:
        store.create_topic("t", 1)
        store.append(encode_record(topic="t", body=b"kept"))
    for other in (StoreConfig(commitlog_file_size_bytes=32 * 1024, cq_entries_per_file=100),
                  StoreConfig(commitlog_file_size_bytes=64 * 1024, cq_entries_per_file=50)):
        with pytest.raises(StoreLayoutMismatch, match="created with"):
            MessageStore.open(tmp_path, other)
    with MessageStore(tmp_path, SMALL) as store:
        assert store.max_offset("t", 0) == 1
        assert bytes(store.get("t", 0, 0).records[0][-4:]) == b"kept"
