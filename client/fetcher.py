"""Background fetchers feeding one bounded, thread-safe buffer.

Each owned queue first finds where to start (unless told) and which broker leads it; then the
session of that broker fetches it, with every other queue that broker leads, in FETCH long polls
(one request naming many queues, as Kafka's Fetch does) and puts what each queue got into
:class:`~gms.client.fetch_buffer.FetchBuffer` as one chunk per queue and answer. A queue may have at most
``PREFETCH_CHUNKS`` unconsumed chunks (a permit per chunk, given back when ``poll`` takes the
chunk; a queue out of permits is left out of requests), so memory is bounded by
queues × chunks × fetch_max_bytes. A queue's own failure (out of range, not the leader, held,
deleted) affects that queue alone; a request's failure re-routes its queues.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

from gms.client.body_decode import decode_fetch_body, decode_pull_body
from gms.client.connections import msg_id_prefix
from gms.client.fetch_buffer import Chunk, FetchBuffer
from gms.client.routing import LONG_POLL_LEADER_CHECK_INTERVAL_MS, LeaderMovedError, RouteProvider, abandon_when
from gms.client.runtime import ClientRuntime
from gms.client.structs import DamagedRecord
from gms.errors import (
    BadRequestError,
    ConnectionClosedError,
    GmsError,
    NotLeaderError,
    OffsetIllegalError,
    QueueHeldError,
    QueueNotFoundError,
    ServiceUnavailableError,
    TopicNotFoundError,
    error_for_status,
)
from gms.protocol.codes import RequestCode
from gms.protocol.fetch import (
    FETCH_TOTAL_BYTES_DEFAULT,
    OK,
    FetchedQueue,
    FetchRequest,
    QueueFetch,
    decode_fetch_answer,
)
from gms.store_errors import CorruptRecord
from gms.tags import TagFilter

log = logging.getLogger(__name__)

PREFETCH_CHUNKS = 4
FETCH_ERROR_BACKOFF_MS = 200
# Queues one FETCH names at most. A request naming thousands stops reading where its byte budget
# (max_total_bytes) runs out, and the next one names them all again: the broker re-reads every
# queue it already drained to reach those it did not (a group of 1,000 topics of 4 queues, 50
# records each, took four requests of 4,000 queues). A thousand queues of a few dozen records
# fit one answer.
FETCH_REQUEST_QUEUES = 1000
# With none in flight (a start), the first request names this share of FETCH_REQUEST_QUEUES and
# each next one twice as many: the first answer comes while the broker reads the rest, and the
# consumer hands it out meanwhile (rather than waiting for a thousand queues read).
FETCH_RAMP_DIVISOR = 8
# Queues with records a request names at least (one queue may fill an answer: requests of one
# each would park by the hundred on queues that turn out empty).
FETCH_FIT_QUEUES_MIN = 64


class TopicQueue(NamedTuple):
    """One queue of a topic, wherever its leader is."""

    topic: str
    queue_id: int


async def leader_of(routes: RouteProvider, queue: TopicQueue) -> str:
    """The address of the broker leading ``queue`` now (from the cached routes)."""
    for route in await routes.routes(queue.topic):
        if route.queue_id == queue.queue_id:
            return route.broker
    raise ServiceUnavailableError(f"queue {queue.topic}/{queue.queue_id} has no live leader now")


async def leaders(routes: RouteProvider, topics: Iterable[str]) -> dict[TopicQueue, str]:
    """The brokers leading the queues of ``topics`` now, routes not cached asked together (a
    topic whose lookup fails and a queue without a live leader are left out)."""
    found: dict[TopicQueue, str] = {}
    missing = []
    for topic in topics:
        cached = routes.cached(topic)
        if cached is None:
            missing.append(topic)
        else:
            found.update((TopicQueue(topic, r.queue_id), r.broker) for r in cached)
    answers = await asyncio.gather(*(routes.routes(topic) for topic in missing), return_exceptions=True)
    for topic, answer in zip(missing, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, GmsError):
                raise answer
            continue
        found.update((TopicQueue(topic, r.queue_id), r.broker) for r in answer)
    return found


class Permits:
    """How many more chunks a queue may put in the buffer (``PREFETCH_CHUNKS`` unconsumed at
    most); ``release`` (on the loop) gives one back and wakes the queue's fetcher when it was out."""

    __slots__ = ("free", "on_free")

    def __init__(self) -> None:
        self.free = PREFETCH_CHUNKS
        self.on_free: Callable[[], None] | None = None

    def release(self) -> None:
        self.free += 1
        if self.free == 1 and self.on_free is not None:
            self.on_free()

    @staticmethod
    def release_all(permits: Sequence[Permits]) -> None:
        for taken in permits:
            taken.release()


class QueueState:
    """One queue this consumer reads. ``position`` (next offset to hand out; None until the
    fetcher found where to start) is written by the polling thread once known; ``revoked``
    is set by the loop when the queue is taken away, ``paused`` by ``Consumer.pause``. The
    rest belongs to the fetcher (on the loop): where it fetches next, the broker session
    fetching it, and ``epoch``, which a stop moves on so that answers asked before are dropped."""

    __slots__ = ("caught_up", "committed", "epoch", "failing", "fetch_offset", "key", "paused", "permits",
                 "position", "retry_at", "revoked", "session", "task")

    def __init__(self, key: TopicQueue) -> None:
        self.key = key
        self.position: int | None = None
        self.committed: int | None = None
        self.revoked = False
        self.paused = False
        self.permits = Permits()
        self.task: asyncio.Task[None] | None = None  # finding where it starts and who leads it
        self.fetch_offset = 0
        self.epoch = 0
        self.session: _BrokerSession | None = None
        self.retry_at = 0.0  # loop time before which it is not fetched (after a failure)
        self.failing = False  # its last fetch failed (logged once per run of failures)
        self.caught_up = False  # its last answer reached the queue's end (it waits for new records)


# A pull failing with one of these means the route is stale: the queue moved or its broker died.
LEADER_LOST_ERRORS = (NotLeaderError, ConnectionClosedError, ServiceUnavailableError, LeaderMovedError)

# Where a queue starts: (offset to fetch from, committed offset or None), asked when no position
# is given; the offset may be FETCH's EARLIEST or LATEST.
StartOffset = Callable[[TopicQueue], Awaitable[tuple[int, int | None]]]
# Where newly assigned queues start, asked together, given their leaders: a StartOffset answer
# per queue, or None for a queue to place alone (its lookup failed, or needs a request of its own).
StartOffsets = Callable[[list[TopicQueue], Mapping[TopicQueue, str]],
                        Awaitable[list[tuple[int, int | None] | None]]]


class Fetcher:
    """Fetches the owned queues: one session per broker, each a FETCH long poll naming every
    queue that broker leads (on the I/O loop)."""

    def __init__(self, runtime: ClientRuntime, buffer: FetchBuffer, filters: Mapping[str, TagFilter], *,
                 group: str | None, member: str | None, max_messages: int, max_bytes: int,
                 long_poll_ms: int, on_leader_lost: Callable[[], None] = lambda: None) -> None:
        """``on_leader_lost`` hears of a queue whose broker no longer leads it or is unreachable:
        the consumer refreshes its routes and heartbeats at once instead of at the next beat."""
        self.runtime = runtime
        self.on_leader_lost = on_leader_lost
        self.buffer = buffer
        self.filters = filters
        self.wire_filters = {topic: (f.expression, f.sql or "") for topic, f in filters.items()}
        self.group = group or ""
        self.member = member or ""
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.long_poll_ms = long_poll_ms
        self._sessions: dict[str, _BrokerSession] = {}
        # Placements of many queues by one task (start_many), with the queues still waiting for it.
        self._placing: dict[asyncio.Task[None], set[QueueState]] = {}

    def start(self, state: QueueState, start_offset: StartOffset) -> None:
        """Fetch ``state``'s queue from its position, or from ``start_offset`` if it has none yet."""
        state.task = asyncio.get_running_loop().create_task(self._place(state, start_offset))

    def start_many(self, states: list[QueueState], start_offsets: StartOffsets, start_offset: StartOffset) -> None:
        """:meth:`start` newly assigned queues (no position yet) in one task: their start offsets
        and leaders asked in one pass, not a task, a future and two route lookups per queue (a
        group of thousands of queues starts fetching at once). A queue whose lookup fails is
        placed alone, with retries."""
        task = asyncio.get_running_loop().create_task(self._place_many(states, start_offsets, start_offset))
        self._placing[task] = set(states)
        task.add_done_callback(lambda done: self._placing.pop(done, None))
        for state in states:
            state.task = task

    async def _place_many(self, states: list[QueueState], start_offsets: StartOffsets,
                          start_offset: StartOffset) -> None:
        led = await leaders(self.runtime.routes, dict.fromkeys(state.key.topic for state in states))
        try:
            starts = await start_offsets([state.key for state in states], led)
        except (GmsError, CorruptRecord) as err:
            self.failed("finding where the assigned queues start", err, loud=False)
            starts = [None] * len(states)
        task = asyncio.current_task()
        for state, start in zip(states, starts, strict=True):
            if state.task is not task:
                continue  # stopped meanwhile
            broker = led.get(state.key)
            if start is None or broker is None:
                self.start(state, start_offset)
                continue
            state.task = None
            state.position = start[0] if start[0] >= 0 else None
            state.fetch_offset, state.committed = start
            self._hand_over(state, broker)

    def reroute(self, state: QueueState, why: GmsError) -> None:
        """Take ``state`` from its session and place it again with its leader after a back-off."""
        if state.session is not None:
            state.session.remove(state)
        state.task = asyncio.get_running_loop().create_task(self._place(state, None, why))

    async def _place(self, state: QueueState, start_offset: StartOffset | None, after: GmsError | None = None) -> None:
        """Find where ``state`` starts (unless known) and who leads it; hand it to that broker's session."""
        key = state.key
        if after is not None:
            await self._back_off(f"fetch from {key.topic}/{key.queue_id}", after)
        if start_offset is not None:  # placed for the first time: from its position, or where it starts
            if state.position is None:
                start, state.committed = await self._retrying(
                    f"finding where {key.topic}/{key.queue_id} starts", lambda: start_offset(key))
                # EARLIEST / LATEST: the first answer says where that is (an empty chunk moves the position)
                state.position = start if start >= 0 else None
            else:
                start = state.position
            state.fetch_offset = start
        routes = self.runtime.routes
        broker = await self._retrying(f"finding the leader of {key.topic}/{key.queue_id}",
                                      lambda: leader_of(routes, key))
        self._hand_over(state, broker)

    def _hand_over(self, state: QueueState, broker: str) -> None:
        """Fetch ``state``'s queue in ``broker``'s session (unless it was paused or revoked meanwhile)."""
        if state.revoked or state.paused:
            return
        session = self._sessions.get(broker)
        if session is None:
            session = self._sessions[broker] = _BrokerSession(self, broker)
        session.add(state)

    async def close(self) -> None:
        """Cancel the requests still in flight once every queue was stopped: what a client on its
        caller's loop (gms.client.aio) does at its end, where no loop thread's end cancels them."""
        requests = [task for session in self._sessions.values() for task in session.requests]
        for task in requests:
            task.cancel()
        await asyncio.gather(*requests, return_exceptions=True)

    def abandon(self, state: QueueState) -> asyncio.Task[None] | None:
        """Stop placing ``state``'s queue: its placement task, cancelled unless it still places
        other queues (then it passes this one), which is returned."""
        task, state.task = state.task, None
        if task is None:
            return None
        others = self._placing.get(task)
        if others is not None:
            others.discard(state)
            if others:
                return None
        task.cancel()
        return task

    async def stop(self, state: QueueState) -> None:
        """Stop fetching ``state``'s queue and forget what it fetched but ``poll`` did not take."""
        task = self.abandon(state)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        if state.session is not None:
            state.session.remove(state)
        state.epoch += 1
        self.buffer.drop(lambda chunk: chunk.state is state)
        state.permits = Permits()

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """``call()`` until it succeeds, backing off after each failure."""
        while True:
            try:
                return await call()
            except (GmsError, CorruptRecord) as err:
                await self._back_off(what, err)

    async def _back_off(self, what: str, err: GmsError | CorruptRecord) -> None:
        self.failed(what, err)
        await asyncio.sleep(FETCH_ERROR_BACKOFF_MS / 1000)

    def failed(self, what: str, err: GmsError | CorruptRecord, *, loud: bool = True) -> None:
        """Log a failed request (quietly if it will pass, or ``loud`` is False), re-route if the
        leader is gone."""
        quiet = not loud or isinstance(err, (BadRequestError, QueueHeldError)) or getattr(err, "retriable", False)
        log.log(logging.DEBUG if quiet else logging.WARNING, "%s failed: %r", what, err)
        if isinstance(err, LEADER_LOST_ERRORS):
            self.on_leader_lost()


class _Taken(NamedTuple):
    """An answer's rows to make chunks of, as columns (not a tuple per row for the collector to
    walk): queue, offset asked, row, where its records start in the body, the queue's epoch."""

    states: list[QueueState]
    offsets: list[int]
    rows: list[FetchedQueue]
    starts: list[int]
    epochs: list[int]

    def add(self, state: QueueState, offset: int, row: FetchedQueue, start: int) -> None:
        self.states.append(state)
        self.offsets.append(offset)
        self.rows.append(row)
        self.starts.append(start)
        self.epochs.append(state.epoch)

    def current(self) -> _Taken:
        """Those of the queues not stopped since (their epoch moved on)."""
        kept = _Taken([], [], [], [], [])
        for state, offset, row, start, epoch in zip(*self, strict=True):
            if state.epoch == epoch:
                kept.add(state, offset, row, start)
        return kept


class _BrokerSession:
    """The queues one broker leads, fetched with FETCH requests. Each queue is in one request at a
    time; queues that become fetchable while a request waits (a permit given back, a queue
    added) go out in another one at once, and an answer with nothing (its poll ran out) merges
    the requests still waiting into the next ones (FETCH_REQUEST_QUEUES queues each)."""

    def __init__(self, fetcher: Fetcher, broker: str) -> None:
        self.fetcher = fetcher
        self.broker = broker
        self.prefix = msg_id_prefix(broker)
        self.queues: dict[TopicQueue, QueueState] = {}
        # The queues asked for in a request now, and by which (a queue stopped and started again
        # meanwhile, by a seek, goes out in a new request; the old one's answer is dropped).
        self.inflight: dict[TopicQueue, object] = {}
        self.requests: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._kicked = False
        self._kick = self.kick  # one bound method every queue's permits call (not one per queue)
        self._timer: asyncio.TimerHandle | None = None
        self._turn = 0  # where the next request starts in the queue list (fair share of max_total_bytes)
        self._fits = FETCH_REQUEST_QUEUES  # queues with records a request names at most (_fitted)

    def add(self, state: QueueState) -> None:
        self.queues[state.key] = state
        state.session = self
        state.permits.on_free = self._kick
        self.kick()

    def remove(self, state: QueueState) -> None:
        if self.queues.get(state.key) is state:
            del self.queues[state.key]
        self.inflight.pop(state.key, None)
        state.session = None
        state.permits.on_free = None

    def kick(self) -> None:
        """Send the next request soon (once for all the reasons that arise meanwhile)."""
        if not self._kicked:
            self._kicked = True
            self._loop.call_soon(self._issue)

    def _issue(self) -> None:
        self._kicked = False
        now = self._loop.time()
        ready: list[QueueState] = []
        waiting: list[QueueState] = []  # caught up: named after the others, in requests of their own
        gone: list[QueueState] = []
        later = float("inf")
        inflight = self.inflight
        for state in self.queues.values():
            if state.revoked or state.paused:
                gone.append(state)
            elif state.permits.free <= 0 or state.key in inflight:
                continue
            elif state.retry_at > now:
                later = min(later, state.retry_at)
            else:
                (waiting if state.caught_up else ready).append(state)
        for state in gone:
            self.remove(state)
        if later != float("inf") and (self._timer is None or self._timer.when() > later):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(later, self._retry_due)
        # Queues with records first, in turns (a fair share of max_total_bytes), as many a request as
        # an answer fits; those caught up last, in requests of their own (not passed by the broker).
        self._turn += 1
        first = self._fits if self.inflight else min(max(FETCH_REQUEST_QUEUES // FETCH_RAMP_DIVISOR, 1), self._fits)
        self._send(_turned(ready, self._turn), first, self._fits)
        self._send(_turned(waiting, self._turn), FETCH_REQUEST_QUEUES, FETCH_REQUEST_QUEUES)

    def _send(self, states: list[QueueState], size: int, most: int) -> None:
        """Ask for ``states`` in requests of ``size`` queues, each next one twice as many up to ``most``."""
        while states:
            part, states = states[:size], states[size:]
            size = min(size * 2, most)
            token = object()
            self.inflight.update((s.key, token) for s in part)
            task = self._loop.create_task(self._fetch(part, token))
            self.requests.add(task)
            task.add_done_callback(self.requests.discard)

    def _retry_due(self) -> None:
        self._timer = None
        self.kick()

    async def _fetch(self, states: list[QueueState], token: object) -> None:
        fetcher = self.fetcher
        # What was asked, as columns: a request of thousands of queues lasts a while, and a tuple
        # per queue living that long would be walked by the collector's full collections.
        epochs = [state.epoch for state in states]
        offsets = [state.fetch_offset for state in states]
        topics = {state.key.topic for state in states}
        request = FetchRequest(
            # plain tuples of str and ints (QueueFetch's fields): the collector stops tracking them
            cast(list[QueueFetch], [(*state.key, state.fetch_offset) for state in states]),
            {topic: fetcher.wire_filters[topic] for topic in topics}, fetcher.max_messages, fetcher.max_bytes,
            FETCH_TOTAL_BYTES_DEFAULT, fetcher.long_poll_ms, fetcher.group, fetcher.member)
        runtime = fetcher.runtime
        try:
            try:
                frame = await abandon_when(
                    runtime.pool.request(self.broker, RequestCode.FETCH, request.fields(),
                                         timeout_ms=fetcher.long_poll_ms + runtime.request_timeout_ms),
                    lambda: self._moved(states), LONG_POLL_LEADER_CHECK_INTERVAL_MS)
                rows = decode_fetch_answer(frame.fields, len(frame.body))
                body, crc_checked = memoryview(frame.body), bool(frame.fields.get("crc_checked", False))
                del frame  # its header (a list per row) goes now, not once the records are decoded
            finally:
                for state in states:
                    if self.inflight.get(state.key) is token:
                        del self.inflight[state.key]
        except GmsError as err:
            self._request_failed(states, err)
            return
        except asyncio.CancelledError:
            # Merged away by an idle answer, whose own next request may have gone out before
            # these queues were free again: ask for them now, or they wait for the next kick.
            self.kick()
            raise
        self._fitted(len(states), len(rows), len(body))
        taken = self._advance(states, epochs, offsets, rows)
        self.kick()
        if taken.states:
            await asyncio.sleep(0)  # the next request goes out before this answer's records are decoded
            # A queue stopped meanwhile (paused, sought, revoked: its buffered chunks were dropped)
            # takes none of this answer's records.
            self.fetcher.buffer.put_many(self._chunks(taken.current(), body, crc_checked))
        elif not rows and len(self.requests) > self._requests_needed(len(states)):
            # idle: wait on every queue in as few requests as they fit again
            for other in self.requests:
                if other is not asyncio.current_task():
                    other.cancel()

    def _fitted(self, asked: int, answered: int, size: int) -> None:
        """Learn from an answer of ``size`` bytes holding ``answered`` rows of ``asked`` queues how
        many a request fits: as many as one its byte budget cut held (queues of hundreds of records
        each; naming more costs both sides the queues past it, named again next time), doubled
        back up to FETCH_REQUEST_QUEUES by each answer it did not cut."""
        total = FETCH_TOTAL_BYTES_DEFAULT
        if answered < asked and size >= total - min(self.fetcher.max_bytes, total // 2):
            self._fits = max(answered, FETCH_FIT_QUEUES_MIN)  # the byte budget ran out (or as good as)
        elif asked >= self._fits:
            self._fits = min(self._fits * 2, FETCH_REQUEST_QUEUES)

    def _requests_needed(self, freed: int) -> int:
        """How few requests could ask for the queues asked for now and the ``freed`` ones."""
        return -(-(len(self.inflight) + freed) // FETCH_REQUEST_QUEUES)

    def _request_failed(self, states: list[QueueState], err: GmsError) -> None:
        """A whole request failed: its queues are placed again (the broker may be gone) or retried."""
        self.fetcher.failed(f"fetch from {self.broker}", err)
        mine = [s for s in states if s.session is self]
        if isinstance(err, LEADER_LOST_ERRORS):
            for state in mine:
                self.fetcher.reroute(state, err)
            return
        retry_at = self._loop.time() + FETCH_ERROR_BACKOFF_MS / 1000
        for state in mine:
            state.retry_at = retry_at
        self.kick()

    def _advance(self, states: list[QueueState], epochs: list[int], offsets: list[int],
                 rows: list[FetchedQueue]) -> _Taken:
        """Move each queue of the answer on past what its row holds (or handle its error), so
        the next request can go out at once (``states`` were asked at ``epochs`` and
        ``offsets``); the rows to make chunks of."""
        asked = zip(states, epochs, offsets, strict=True)
        current = {state.key: index for index, (state, epoch, offset) in enumerate(asked)
                   if state.epoch == epoch and state.session is self and state.fetch_offset == offset}
        taken = _Taken([], [], [], [], [])
        end = 0
        for row in rows:
            start, end = end, end + row.size
            index = current.get((row.topic, row.queue_id))  # type: ignore[call-overload]
            if index is None:
                continue  # stopped, moved or revoked meanwhile: not asked any more
            state, offset = states[index], offsets[index]
            if row.status != OK:
                self._queue_failed(state, error_for_status(
                    row.status, row.error, {"min_offset": row.min_offset, "max_offset": row.max_offset}))
                continue
            state.failing = False
            state.caught_up = row.next_offset >= row.max_offset
            if row.size:
                state.permits.free -= 1
            elif row.next_offset == offset:
                continue
            state.fetch_offset = row.next_offset
            taken.add(state, offset, row, start)
        return taken

    def _chunks(self, taken: _Taken, body: memoryview, crc_checked: bool) -> list[Chunk]:
        """The rows' records as chunks for the buffer (a chunk of records holds a permit; one of
        none moves the position past what the broker skipped: unmatched, expired, damaged)."""
        filters = self.fetcher.filters
        verify_crc = not crc_checked
        spans = [(start, start + row.size, filters[state.key.topic])
                 for state, row, start in zip(taken.states, taken.rows, taken.starts, strict=True)]
        whole = decode_fetch_body(body, spans, self.prefix, verify_crc=verify_crc)
        chunks: list[Chunk] = []
        for index, (state, offset, row, start) in enumerate(zip(*taken[:4], strict=True)):
            batch, first, last = None, 0, 0
            if row.size and whole is not None:
                batch, first, last = whole[0], whole[1][index], whole[2][index]
            elif row.size:
                try:
                    messages = decode_pull_body(body[start:start + row.size], self.prefix,
                                                filters[state.key.topic], verify_crc=verify_crc).parts()
                except CorruptRecord as err:  # fetched again from where it was asked
                    state.epoch += 1  # what was asked from past it meanwhile is dropped
                    state.fetch_offset = offset
                    self._queue_failed(state, err)
                    state.permits.release()
                    continue
                if messages:
                    batch, first, last = messages[0]
            damaged = [DamagedRecord(state.key.topic, state.key.queue_id, at, f"{self.prefix}{phys:016X}")
                       for at, phys in row.damaged] if row.damaged else ()
            chunks.append(Chunk(state, batch, first, last, row.next_offset, bool(row.size), damaged))
        return chunks

    def _queue_failed(self, state: QueueState, err: GmsError | CorruptRecord) -> None:
        """One queue's row failed: the others go on. Out of range: on at the nearest valid offset;
        not the leader: placed again; else retried after a back-off (logged once per run)."""
        key = state.key
        what = f"fetch from {key.topic}/{key.queue_id}"
        if isinstance(err, OffsetIllegalError):
            state.fetch_offset = _clamp(state.fetch_offset, err.fields)
            log.warning("%s: %s; continuing at offset %d", key, err, state.fetch_offset)
        elif isinstance(err, LEADER_LOST_ERRORS):
            self.fetcher.reroute(state, err)
        else:
            self.fetcher.failed(what, err, loud=not state.failing)
            if not state.failing and isinstance(err, (TopicNotFoundError, QueueNotFoundError)):
                self.fetcher.on_leader_lost()  # deleted: the routes and the group hear of it now
            state.failing = True
            state.retry_at = self._loop.time() + FETCH_ERROR_BACKOFF_MS / 1000

    async def _moved(self, states: list[QueueState]) -> GmsError | None:
        """Why to give a waiting request up: its broker is no longer registered (paused or cut
        off: its queues have other leaders), or the routes name another leader of one of its queues."""
        routes = self.fetcher.runtime.routes
        try:
            if self.broker not in await routes.live_brokers():
                return ServiceUnavailableError(f"{self.broker} is no longer registered: fetch abandoned")
        except GmsError:
            return None  # not known now: the request waits on
        for state in states:
            cached = routes.cached(state.key.topic)
            for route in cached or ():
                if route.queue_id == state.key.queue_id and route.broker != self.broker:
                    return LeaderMovedError(state.key.topic, state.key.queue_id, self.broker, route.broker)
        return None


def _turned(states: list[QueueState], turn: int) -> list[QueueState]:
    """``states`` rotated by ``turn`` (each in its turn first)."""
    return states[turn % len(states):] + states[:turn % len(states)] if states else states


def _clamp(offset: int, bounds: Mapping[str, Any]) -> int:
    low, high = bounds.get("min_offset", 0), bounds.get("max_offset", 0)
    return min(max(offset, low), high)
