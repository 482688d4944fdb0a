"""The consumer: ``poll`` / iteration over subscribed topics, commits, group membership.

Like Kafka's consumer, group work that must be ordered with the application's processing
happens inside :meth:`Consumer.poll`: messages returned by earlier polls count as processed,
so a revoked queue's position is committed there, its buffered messages are dropped and the
queue is released before the broker may hand it to another member. Delivery is at-least-once.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence

from gms.client.encoder import RecordEncoder
from gms.client.fetcher import FetchBuffer, Fetcher, QueueState
from gms.client.rebalance import Membership, StartFrom
from gms.client.routing import QueueRoute
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.client.structs import ReceivedMessage, ReceivedMessages
from gms.errors import BadTagExpressionError
from gms.tags import BadTagExpression, TagFilter, parse_tag_expression

MODES = ("clustering", "broadcasting")
LONG_POLL_MS = 5000
ITER_POLL_MS = 1000


class Consumer:
    """Reads subscribed topics as a member of ``group``. Use from one thread.

    Routes come from ``nameserver="host:9876[,...]"`` or a fixed ``brokers`` list; in a
    cluster the member heartbeats to every broker holding a subscribed queue, and each broker
    assigns its own queues."""

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
        *,
        nameserver: Sequence[str] | str | None = None,
        group: str,
        subscription: Mapping[str, str],
        mode: str = "clustering",
        start_from: StartFrom = "last",
        auto_commit: bool = True,
        auto_commit_interval_ms: float = 1000,
        heartbeat_interval_ms: float | None = None,
        max_poll_messages: int = 1024,
        fetch_max_messages: int = 4096,
        fetch_max_bytes: int = 1024 * 1024,
        long_poll_ms: int = LONG_POLL_MS,
        request_timeout_ms: float = REQUEST_TIMEOUT_MS,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if start_from not in ("first", "last") and (isinstance(start_from, bool) or not isinstance(start_from, int)):
            raise ValueError(f"start_from must be 'first', 'last' or a timestamp in ms, not {start_from!r}")
        if not subscription:
            raise ValueError("subscribe to at least one topic")
        filters = _parse_subscription(subscription)
        self._clustering = mode == "clustering"
        self._auto_commit_s = auto_commit_interval_ms / 1000 if auto_commit else None
        self._max_poll_messages = max_poll_messages
        self._member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-consumer")
        self._buffer = FetchBuffer()
        fetcher = Fetcher(
            self._runtime, self._buffer, filters,
            group=group if self._clustering else None, member=self._member if self._clustering else None,
            max_messages=fetch_max_messages, max_bytes=fetch_max_bytes, long_poll_ms=long_poll_ms,
            on_leader_lost=self._leader_lost,
        )
        self._membership = Membership(
            self._runtime, fetcher, group=group, member=self._member, clustering=self._clustering,
            subscription={t: f.expression for t, f in filters.items()}, start_from=start_from,
            heartbeat_interval_ms=heartbeat_interval_ms,
        )
        self._last_commit = time.monotonic()
        self._closed = False
        try:
            self._runtime.run(self._membership.start())
        except BaseException:
            self._runtime.close()
            raise

    @property
    def member(self) -> str:
        return self._member

    def _leader_lost(self) -> None:
        """A fetch found its queue's leader gone: refresh routes, and heartbeat now (I/O loop)."""
        self._runtime.routes.invalidate()
        self._membership.wake()

    def assignment(self) -> list[QueueRoute]:
        """The queues this consumer reads now (revoked ones excluded)."""
        return sorted(r for r, s in list(self._membership.states.items()) if not s.revoked)

    def poll(self, timeout_ms: float = ITER_POLL_MS) -> ReceivedMessages:
        """The next messages (up to ``max_poll_messages``), waiting up to ``timeout_ms`` for some.

        A sequence that makes each :class:`ReceivedMessage` when it is iterated or indexed."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        self._apply_revocations()
        if self._auto_commit_s is not None and time.monotonic() - self._last_commit >= self._auto_commit_s:
            self.commit()
        chunks = self._buffer.take(self._max_poll_messages, timeout_ms / 1000)
        messages: list[ReceivedMessages] = []
        release = self._runtime.loop.call_soon_threadsafe
        for chunk in chunks:
            state = chunk.state
            if state.revoked:
                continue
            messages.append(chunk.messages)
            state.position = chunk.next_offset
            if chunk.holds_permit:
                release(state.permits.release)
        return ReceivedMessages.concat(messages)

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while not self._closed:
            yield from self.poll(ITER_POLL_MS)

    def commit(self) -> None:
        """Commit the position after every message returned so far (no-op in broadcasting)."""
        self._commit(list(self._membership.states.values()))

    def _commit(self, states: list[QueueState]) -> None:
        self._last_commit = time.monotonic()
        if not self._clustering:
            return
        changed = [s for s in states if s.position != s.committed]
        if not changed:
            return
        self._runtime.run(self._membership.commit({s.route: s.position for s in changed}))
        for state in changed:
            state.committed = state.position

    def _apply_revocations(self) -> None:
        revoked = self._membership.take_revoked()
        if not revoked:
            return
        states = [self._membership.states[r] for r in revoked if r in self._membership.states]
        self._buffer.drop(lambda chunk: chunk.state.revoked)
        self._commit(states)
        self._runtime.run(self._membership.release(revoked))

    def close(self) -> None:
        """Commit, leave the group and close the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runtime.run(self._membership.stop())
            self._apply_revocations_on_close()
            self._runtime.run(self._membership.unregister())
        finally:
            self._runtime.close()

    def _apply_revocations_on_close(self) -> None:
        self._membership.take_revoked()
        self._commit(list(self._membership.states.values()))

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _parse_subscription(subscription: Mapping[str, str]) -> dict[str, TagFilter]:
    encoder = RecordEncoder()
    filters = {}
    for topic, expression in subscription.items():
        encoder.topic(topic)  # InvalidTopicError for a bad name
        try:
            filters[topic] = parse_tag_expression(expression)
        except BadTagExpression as err:
            raise BadTagExpressionError(str(err)) from err
    return filters
