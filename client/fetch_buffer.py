"""The buffer between the fetchers (on the I/O loop) and ``poll`` (on the application's thread):
what each queue got of each FETCH answer, as a :class:`Chunk`, in arrival order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gms.client.structs import DamagedRecord, MessageBatch, ReceivedMessages

if TYPE_CHECKING:
    from gms.client.fetcher import QueueState


class Chunk:
    """One queue's messages of one FETCH answer, ``batch``'s ``start`` to ``stop`` (the messages of
    one answer share its batch: a poll hands out the chunks of consecutive queues as one range of
    it), and the damaged records the broker passed among them."""

    __slots__ = ("batch", "damaged", "holds_permit", "next_offset", "start", "state", "stop")

    def __init__(self, state: QueueState, batch: MessageBatch | None, start: int, stop: int, next_offset: int,
                 holds_permit: bool, damaged: Sequence[DamagedRecord] = ()) -> None:
        self.state = state
        self.batch = batch  # None: no messages
        self.start = start
        self.stop = stop
        self.next_offset = next_offset
        self.holds_permit = holds_permit
        self.damaged = damaged  # in queue offset order, all below next_offset

    def __len__(self) -> int:
        return self.stop - self.start

    def split(self, index: int) -> Chunk:
        """Hand the messages before ``index`` (of the batch, inside the chunk) to a chunk of their
        own, returned; this one keeps the rest and the permit."""
        assert self.batch is not None and self.start < index < self.stop
        cut = self.batch.queue_offset(index - 1) + 1
        damaged = self.damaged
        self.damaged = [d for d in damaged if d.queue_offset >= cut]
        head = Chunk(self.state, self.batch, self.start, index, cut, False,
                     [d for d in damaged if d.queue_offset < cut])
        self.start = index
        return head


def received(chunks: Sequence[Chunk]) -> ReceivedMessages:
    """The messages of ``chunks`` in order, the ranges of consecutive queues of one answer joined."""
    parts: list[tuple[MessageBatch, int, int]] = []
    for chunk in chunks:
        batch, start, stop = chunk.batch, chunk.start, chunk.stop
        if batch is None or stop == start:
            continue
        if parts and parts[-1][0] is batch and parts[-1][2] == start:
            start = parts.pop()[1]
        parts.append((batch, start, stop))
    return ReceivedMessages(parts)


class FetchBuffer:
    """Chunks waiting for ``poll``: filled by the loop thread, drained by the user thread."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._chunks: deque[Chunk] = deque()
        self._arrival: asyncio.Future[None] | None = None  # an asyncio consumer's poll waiting (see wait)

    def put_many(self, chunks: Sequence[Chunk]) -> None:
        with self._ready:
            self._chunks.extend(chunks)
            self._ready.notify()
        self._arrived()

    def take(self, max_messages: int, timeout_s: float) -> list[Chunk]:
        """Up to ``max_messages`` messages as chunks, waiting up to ``timeout_s`` for the first."""
        deadline = time.monotonic() + timeout_s
        taken: list[Chunk] = []
        room = max_messages
        with self._ready:
            while not self._chunks:
                left = deadline - time.monotonic()
                if (left <= 0 or not self._ready.wait(left)) and not self._chunks:
                    return taken
            chunks = self._chunks
            while chunks and room > 0:
                chunk = chunks[0]
                size = chunk.stop - chunk.start
                if size <= room:
                    chunks.popleft()
                    taken.append(chunk)
                    room -= size
                else:  # split: the rest stays first in line and keeps the permit
                    taken.append(chunk.split(chunk.start + room))
                    room = 0
        return taken

    def put_back(self, chunks: Sequence[Chunk]) -> None:
        """Return taken ``chunks`` to the front of the line, in order."""
        with self._ready:
            self._chunks.extendleft(reversed(chunks))
            self._ready.notify()
        self._arrived()

    def drop(self, is_dropped: Callable[[Chunk], bool]) -> None:
        with self._ready:
            self._chunks = deque(c for c in self._chunks if not is_dropped(c))

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()
        self._arrived()

    async def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for chunks to :meth:`take`: an asyncio consumer's poll, on the
        loop that fills the buffer (so nothing else needs a lock or a thread to wake it)."""
        if self._chunks or timeout_s <= 0:
            return
        self._arrival = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await self._arrival
        except TimeoutError:
            pass
        finally:
            self._arrival = None

    def _arrived(self) -> None:
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)
