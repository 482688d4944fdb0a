import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any, Self

class FutureHandle:
    """One message's place in its batch's Future (C): see client/_append.c."""

    def __new__(cls, batch: concurrent.futures.Future[Sequence[Any]], index: int) -> Self: ...
    @property
    def _batch(self) -> concurrent.futures.Future[Sequence[Any]]: ...
    @property
    def _index(self) -> int: ...
    def _track(self) -> None: ...

class AppenderBase:
    """The accumulator's state that append_plain reads, and append_plain itself (C)."""

    _lock: threading.Lock
    _sticky: dict[str, Any]
    _future_type: type[FutureHandle]
    _buffered_bytes: int
    _buffer_bytes_max: int
    _batch_bytes: int
    _body_size_max: int
    def append_plain(self, topic: str, body: bytes, tag: str | None, /) -> Any: ...
