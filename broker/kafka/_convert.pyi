from collections.abc import Callable, Sequence

from typing_extensions import Buffer

def to_gms(raw: Buffer, count: int, base_ts: int, topic: bytes, queue_id: int, host: bytes, limit: int,
           convert: Callable[[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]], bytes],
           chunks: list[bytearray], /) -> bool: ...
def to_kafka(views: Sequence[Buffer], convert: Callable[[memoryview, int, int, int], bytes], /
             ) -> tuple[bytearray, int, int, int, int, int]: ...
