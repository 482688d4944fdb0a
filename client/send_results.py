"""What a send answers: :class:`SendResult`, a batch's lazy :class:`SendResults`, and awaiting a
``send_async`` / ``send_nowait`` :class:`SendFuture` (a C type) from any event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Generator, Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from gms.client._append import SendFuture as SendFuture  # C: one per send_async message
from gms.client._append import set_await_hook


class SendResult(NamedTuple):
    """Where the broker stored one message."""

    msg_id: str  # encodes the broker address and commitlog offset (see gms.msgid)
    topic: str
    queue_id: int
    queue_offset: int
    broker: str  # "host:port" of the broker that stored it


def _awaited(future: SendFuture) -> Generator[Any, None, SendResult]:
    """``await future`` (a send_async's or send_nowait's): its result once its batch is answered,
    waited for on the awaiting loop (the batch is answered on the producer's loop, that one for
    an asyncio producer, a thread of its own for a sync one)."""
    if not future.done():
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        future.add_done_callback(functools.partial(_answered, loop, answered))
        yield from answered
    return future.result()


def _answered(loop: asyncio.AbstractEventLoop, answered: asyncio.Future[None], _: object) -> None:
    if asyncio._get_running_loop() is loop:
        if not answered.done():  # not cancelled meanwhile
            answered.set_result(None)
    else:
        loop.call_soon_threadsafe(_answered, loop, answered, None)


set_await_hook(_awaited)


class _ListLike(Sequence[Any]):
    """Equality and ``+`` of a lazy sequence that stands in for a list."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Sequence[Any]) -> list[Any]:
        return [*other, *self]


class SendResults(_ListLike, Sequence[SendResult]):
    """The results of one batch send, in input order, made on access.

    A batch of thousands of messages would otherwise build as many :class:`SendResult` tuples
    and message-id strings that most callers never look at; this keeps the response's arrays
    and builds the one asked for. Compares equal to, and concatenates with, lists.
    """

    __slots__ = ("_broker", "_phys_offsets", "_prefix", "_queue_ids", "_queue_offsets", "_topic")

    def __init__(self, topic: str, broker: str, msg_id_prefix: str, queue_ids: np.ndarray,
                 queue_offsets: np.ndarray, phys_offsets: np.ndarray) -> None:
        self._topic = topic
        self._broker = broker
        self._prefix = msg_id_prefix
        self._queue_ids = queue_ids
        self._queue_offsets = queue_offsets
        self._phys_offsets = phys_offsets

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def broker(self) -> str:
        return self._broker

    @classmethod
    def concat(cls, parts: Sequence[SendResults]) -> SendResults:
        """The results of ``parts`` one after the other (all of one topic and broker)."""
        first = parts[0]
        return cls(first._topic, first._broker, first._prefix,
                   np.concatenate([p._queue_ids for p in parts]),
                   np.concatenate([p._queue_offsets for p in parts]),
                   np.concatenate([p._phys_offsets for p in parts]))

    def __len__(self) -> int:
        return len(self._phys_offsets)

    def arrays(self) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
        """The results as columns: the broker's message id prefix, queue ids, queue offsets and
        commitlog offsets (message ``i``'s id is ``f"{prefix}{phys_offsets[i]:016X}"``)."""
        return self._prefix, self._queue_ids, self._queue_offsets, self._phys_offsets

    @overload
    def __getitem__(self, index: int) -> SendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...

    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return SendResult(f"{self._prefix}{int(self._phys_offsets[index]):016X}", self._topic,
                          int(self._queue_ids[index]), int(self._queue_offsets[index]), self._broker)

    def __iter__(self) -> Iterator[SendResult]:
        prefix, topic, broker = self._prefix, self._topic, self._broker
        for queue_id, offset, phys in zip(self._queue_ids.tolist(), self._queue_offsets.tolist(),
                                          self._phys_offsets.tolist(), strict=True):
            yield SendResult(f"{prefix}{phys:016X}", topic, queue_id, offset, broker)

    def take(self, order: np.ndarray) -> SendResults:
        """These results rearranged: result ``i`` of the new sequence is ``self[order[i]]``."""
        return SendResults(self._topic, self._broker, self._prefix, self._queue_ids[order],
                           self._queue_offsets[order], self._phys_offsets[order])

    def __repr__(self) -> str:
        return f"SendResults({len(self)} results of {self._topic!r} on {self._broker})"
