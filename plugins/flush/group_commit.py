"""The ``sync`` flush policy: group commit (RocketMQ's GroupCommitService).

Writers hand in the offset their bytes end at and get a future.  One thread takes every request
waiting, flushes once (fdatasync releases the GIL, so writers keep appending meanwhile) and
resolves all requests the flush covered together.  A request still not covered after
``timeout_ms`` resolves ``False`` (the store reports FLUSH_DISK_TIMEOUT), even while the flush
itself is stuck in the kernel: a small reaper thread watches the deadlines.

A writer on an event loop (the broker: every send is put from its loop) does not wake the flush
thread per put: the puts of one loop iteration form one *batch*, and the first of them schedules
one *kick* at the end of that iteration (``call_soon``), which hands the batch to the flush thread:
one wake-up per round, not per message, and no gathering wait (``batch_wait_us``) for them.  The
batch's futures share one :class:`tidemq.futures.SharedCompletion`: the flush thread resolves them
in bulk and wakes the loop once; the tasks awaiting them (:func:`tidemq.futures.resolved`) wait
on one asyncio future per batch, so a put under sync flush costs no future, callback or thread hop
of its own.  A batch whose kick never runs (its loop blocked in ``result()`` on its own put) is
handed in by the reaper.  Writer threads (tests, benches, the threaded clients) wake it per put as
before (a batch of one each) and may gather.

*Inline rounds* (``inline_max_us``): when the kick finds no round in flight or waiting, the batch is
small (:data:`INLINE_MAX_PUTS`, :data:`INLINE_MAX_BYTES`) and the last :data:`INLINE_AFTER_FAST` flushes took at most that
long each, it flushes the batch on the loop itself and answers at once, as
Redis' ``appendfsync always`` does: no wake-up of the flush thread, no hop back into the loop.
Whatever arrives meanwhile waits in the sockets and forms the next round, so the group commit
still gathers under load; a slow flush (or a failed one) hands the rounds to the thread again.
With the compiled worker the inline round is its ``round_here`` on the loop's thread (the
``fdatasync`` in C without the GIL, the worker rounds' bookkeeping); else this module's Python
flush path.

*Compiled rounds* (``compiled_rounds``, :mod:`tidemq_flush.native_rounds`): a loop's kick that
would hand its batch to the flush thread posts it to a compiled worker instead, which
calls ``fdatasync`` without the GIL; the loop's eventfd reader answers the rounds.  This thread keeps
what the worker does not take (writer threads, file switches, failed rounds).

*Loop gathering* (``loop_gather_us``): closed-loop senders settle into two groups that alternate,
one put while the other's ``fdatasync`` runs, so a round carries half of what is in flight.  After
a round of :data:`GATHER_MIN_BATCH` loop puts or more, the next one waits (at most
``loop_gather_us``) until its bytes reach what that round flushed plus what was pending when it
ended: the senders it answered come back and one ``fdatasync`` covers both groups.  A wait that
times out three times in a row (a stream, not groups) turns it off for a while
(:data:`GATHER_SKIP_AFTER_MISS`).
"""

from __future__ import annotations

import logging
import threading
import time
from asyncio import AbstractEventLoop
from asyncio import _get_running_loop as running_loop
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import attrs

from tidemq.flush import Flushable, FlushRoundStats
from tidemq.futures import SharedCompletion, StoreFuture, complete_all, complete_here, resolve_all
from tidemq.metrics import BATCH_BOUNDS, Buckets

from .native_rounds import NativeRounds

log = logging.getLogger(__name__)

#: A round whose predecessor flushed at least this many requests lets running writers join
#: before it flushes (when ``batch_wait_us`` > 0); smaller ones flush what is waiting at once.
GATHER_MIN_BATCH = 8
#: After :data:`GATHER_MISSES` loop rounds in a row whose gathering wait ended by its time bound
#: (the senders did not come back in time: a stream rather than closed-loop groups), this many
#: rounds start at once without it, twice as many each further time (up to
#: :data:`GATHER_SKIP_MAX`); a wait that got its bytes resets both.
GATHER_MISSES = 3
GATHER_SKIP_AFTER_MISS = 8
GATHER_SKIP_MAX = 256
#: A loop's round is flushed inline only when it carries at most this many puts (a low rate, where
#: the two wake-ups are most of a send's latency): a bigger round keeps the loop serving during its
#: ``fdatasync`` (measured: inline rounds of 32 puts, or under closed-loop load, lost rate).
INLINE_MAX_PUTS = 4
#: ... and at most this many bytes to flush (a batched send of 32 small messages is one put of
#: ~7 KiB: a high rate, kept on the thread; four single 1 KiB sends are ~5 KiB).
INLINE_MAX_BYTES = 6 << 10
#: ... and only after this many flushes in a row within ``inline_max_us``: a disk with a heavy
#: tail (stalls between fast flushes) keeps its rounds on the thread, where the loop goes on
#: putting what arrives during a stall (measured: inline rounds after the last flush alone lost
#: latency on a disk shared with other jobs).
INLINE_AFTER_FAST = 16


def _positive(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


@attrs.define
class SyncFlushOptions:
    """``[flush.sync]``."""

    #: How long a writer waits for its flush before FLUSH_DISK_TIMEOUT (syncFlushTimeout).
    timeout_ms: int = attrs.field(default=5000, validator=_positive)
    #: Let writers that are already running join a batch for at most this long before the flush
    #: (0: flush at once).  The wait ends as soon as a yield brings no new request, so a lone
    #: writer pays one thread switch, not the whole window.
    batch_wait_us: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    #: ... and the wait ends once no writer has joined for this long (a put takes tens of µs; one
    #: thread switch is not enough: a writer inside a GIL-releasing ``pwrite`` looks idle).
    batch_idle_us: int = attrs.field(default=100, validator=attrs.validators.ge(0))
    #: An event loop's round flushes on the loop itself, at its kick (no thread hop, no wake-up of
    #: the flush thread or of the loop), when no round is in flight or waiting, the round carries
    #: at most 4 puts and 6 KiB (a low rate) and each of the last 16 flushes took at most this
    #: long; else the flush thread does it and the loop keeps serving meanwhile.  The loop is
    #: blocked for that ``fdatasync``: a slower disk (a flush above the bound) hands the rounds to
    #: the thread until 16 in a row are fast again.  0 (the default): always the flush thread; on
    #: a disk whose flushes stall now and then a stall inline holds every connection of the loop
    #: (docs/flush.md, "Inline rounds").  1000 suits a disk with steady fsyncs.
    inline_max_us: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: An event loop's round that follows a round of at least 8 puts (many closed-loop senders)
    #: waits at most this long for as many bytes as that round flushed plus what was pending
    #: when it ended: the senders it answered send again within a round trip, and one
    #: ``fdatasync`` covers both groups instead of one each (fewer rounds, less CPU per message).
    #: It starts as soon as the bytes are there; a lone sender (rounds of fewer puts) never waits,
    #: and three waits in a row that time out (a stream of sends) turn it off for a while.
    #: 0 (the default): a round starts with what is pending.  1000 suits closed-loop batch
    #: producers (docs/flush.md, "Where a sync round's CPU goes": not shown to pay on a shared host).
    loop_gather_us: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: An event loop's rounds are flushed by a compiled worker thread that never takes the GIL
    #: (``fdatasync``, then an eventfd the loop watches; the loop answers every round completed
    #: since its last wake-up in one callback) when ``tidemq_flush._round`` is built and the store
    #: offers it (the mmap commit log; not with a transient store pool's commits, nor with
    #: ``loop_gather_us``).  False: the Python flush thread does every round (docs/flush.md,
    #: "A round without the GIL").
    compiled_rounds: bool = True
    #: Compiled rounds in flight at most: a send kicked while a round's ``fdatasync`` runs starts
    #: its own round at once on another worker thread (each round on its own open file
    #: description of the commit-log file) instead of waiting for the running one to end; rounds
    #: are still answered in the order they started, and a failed one fails every later one not
    #: answered.  Only while sends arrive sparsely (``overlap_max_load``).  1 (the default): one
    #: round at a time; 2 cut the wait of a send kicked during a round, but its end-to-end gain at
    #: 2 000 msg/s was not shown on a shared disk (docs/flush.md, "Overlapping rounds").
    overlap_rounds: int = attrs.field(default=1, validator=[attrs.validators.ge(1), attrs.validators.le(8)])
    #: A second round starts beside a running one only while the recent ``fdatasync`` time is below
    #: this many times the recent gap between kicks (a low rate: it saves those sends the rest of
    #: the running round and adds few ``fdatasync`` calls); a denser stream of kicks merges into the
    #: next round as with one round at a time (batched throughput keeps its rounds and CPU).
    overlap_max_load: float = attrs.field(default=2.0, validator=attrs.validators.ge(0))
    #: An event loop's round that would start the idle compiled worker waits up to this many more
    #: turns of the loop first (each polls the sockets without blocking, no timer) when it carries
    #: many messages (``kick_min_messages``): sends already arrived on other connections join it
    #: instead of waiting for the whole next round.  A round posted while another is in flight is
    #: not held (it waits for the worker anyway), nor a sparse one (a lone send).  0: every round
    #: posted at its kick (docs/flush.md, "Session 10 (branch kickgate)").
    kick_polls: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    #: ... only while the round about to start carries at least this many messages (a batched
    #: put of 32, or many sends in one loop turn: producers that keep the worker busy and whose
    #: senders come back together); a round of fewer (a low rate, where the extra turn is
    #: latency and seldom brings a second send) is posted at its kick.  At 2 000 single sends/s
    #: 99.6 % of the kicks that found the worker idle carried 1-4 messages; batched ones 32-512
    #: (docs/flush.md, "Session 10 (branch kickgate)").  0 or 1: held whenever the worker is idle.
    kick_min_messages: int = attrs.field(default=8, validator=attrs.validators.ge(0))
    #: The compiled worker's gathering (``loop_gather_us``'s, for its rounds): after a round of 64
    #: messages or more (two batched puts of 32) that ends with 64 or more posted and waiting,
    #: its next round waits at most this long until the posted bytes reach what that
    #: round flushed plus what was pending when it ended: closed-loop senders settle into two
    #: cohorts that alternate rounds, and one ``fdatasync`` then covers both (fewer rounds, less
    #: CPU per message).  Three waits in a row that time out (a stream of sends, not cohorts) turn
    #: it off for 8 rounds, twice as many each further time (up to 256).  Single sends at a
    #: moderate rate never wait (at 2 000 msg/s ~2 are posted during a round).  Only with one round in flight (``overlap_rounds = 1``).  0: a
    #: round starts with what is posted (docs/flush.md, "sync128 (session 11)").
    worker_gather_us: int = attrs.field(default=2000, validator=attrs.validators.ge(0))


def _false() -> bool:
    return False


def _messages_reach(values: list[Any], at_least: int) -> bool:
    """Whether the puts resolving to ``values`` (their :class:`PutResult`, 1 message when the
    value says nothing) carry at least ``at_least`` messages."""
    count = 0
    for value in values:
        count += getattr(value, "message_count", 0) or 1
        if count >= at_least:
            return True
    return count >= at_least


class _Batch:
    """Puts made durable together: one loop iteration's (or one writer thread's put)."""

    __slots__ = (
        "completion",
        "deadline",
        "end",
        "ends",
        "futures",
        "on_timeouts",
        "polls",
        "settled",
        "values",
    )

    def __init__(self, deadline: float, completion: SharedCompletion | None) -> None:
        self.end = 0
        self.deadline = deadline  # its first put's: the whole batch times out together
        self.ends: list[int] = []
        self.futures: list[Future[Any]] = []
        self.values: list[Any] = []
        self.on_timeouts: list[Callable[[], Any]] = []
        self.completion = completion
        self.settled = False  # resolved, or timed out (then a late flush changes nothing)
        self.polls = 0  # loop turns its kick waited (``kick_polls``)

    def add(self, end: int, fut: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        if end > self.end:
            self.end = end
        self.ends.append(end)
        self.futures.append(fut)
        self.values.append(value)
        self.on_timeouts.append(on_timeout)

    def resolve(self, completions: list[SharedCompletion] | None = None) -> None:
        """Durable: every put resolved; the group's completion completed now, or (``completions``)
        left to the caller, which completes a whole round's with one wake-up per loop."""
        self.settled = True
        resolve_all(self.futures, self.values)
        if self.completion is not None:
            if completions is None:
                self.completion.complete()
            else:
                completions.append(self.completion)

    def time_out(self, flushed: int) -> None:
        """Past its deadline: each put durable when ``flushed`` covers it, else its ``on_timeout()``."""
        if self.settled:
            return
        self.settled = True
        if flushed >= self.end:
            values = self.values
        else:
            values = [
                value if end <= flushed else on_timeout()
                for end, value, on_timeout in zip(self.ends, self.values, self.on_timeouts, strict=True)
            ]
        resolve_all(self.futures, values)
        if self.completion is not None:
            self.completion.complete()


class GroupCommitFlush:
    """Batches waiting writers behind one flush."""

    #: :class:`tidemq.flush.RoundFlushPolicy`: puts are answered after the round that flushed them.
    flushes_in_rounds = True

    def __init__(self, options: SyncFlushOptions | None = None):
        self.options = options or SyncFlushOptions()
        self._timeout = self.options.timeout_ms / 1000
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: Batches handed in (kicked, or a writer thread's put), waiting for the next round.
        self._pending: list[_Batch] = []
        self._inflight: list[_Batch] = []
        #: Each loop's batch of its current iteration, not handed in yet (its kick is scheduled).
        self._open: dict[AbstractEventLoop, _Batch] = {}
        self._target: Flushable | None = None
        self._stop = False
        self._threads: list[threading.Thread] = []
        #: Flush rounds that wrote something, and requests served: their ratio is the batching.
        self.flush_rounds = 0
        self.requests = 0
        #: Seconds per flush round (commit + fdatasync) and puts per round (the group size).
        self.flush_seconds = Buckets()
        self.batch_sizes = Buckets(BATCH_BOUNDS)
        self._last_batch = 0  # requests served by the last flush round
        #: A round may start: a writer thread's put, or a loop's kick, since the last round began.
        self._ready = False
        #: Writer threads put since the last round began (only their rounds may gather).
        self._threaded = False
        #: Seconds the last flush round took (commit + fdatasync): bounds the inline rounds.
        #: Flushes in a row that took at most ``inline_max_us`` (trusted at start; never with 0).
        inline_us = self.options.inline_max_us
        self._inline_max = inline_us / 1e6 if inline_us > 0 else -1.0  # -1: never
        self._fast_streak = INLINE_AFTER_FAST if inline_us > 0 else 0
        #: Rounds flushed on an event loop at its kick (part of ``flush_rounds``).
        self.inline_rounds = 0
        #: Loop rounds' gathering (``loop_gather_us``): a round waits until its bytes reach this
        #: end offset (what the last round flushed plus what was pending when it ended), 0: no wait.
        self._gather_to = 0
        self._round_start = 0
        self._gathering = False
        self._gather_skip = 0  # rounds left that start at once after a gathering wait timed out
        self._gather_backoff = GATHER_SKIP_AFTER_MISS
        self._gather_misses = 0  # gathering waits in a row that timed out
        self._loop_gather = self.options.loop_gather_us / 1e6
        #: Rounds that waited to gather, those whose wait ended by ``loop_gather_us``, and the
        #: seconds they waited.
        self.gathered_rounds = 0
        self.gather_timeouts = 0
        self.gather_seconds = 0.0
        #: The compiled rounds (``compiled_rounds``), None: every round on the Python thread.
        self._native: NativeRounds | None = None
        self._kick_polls = self.options.kick_polls
        self._kick_min_messages = self.options.kick_min_messages
        #: Loop kicks held a turn (``kick_polls``), and kicks that would have been but carried
        #: fewer than ``kick_min_messages`` messages: posted at once.
        self.kicks_held = 0
        self.kicks_sparse = 0

    def start(self, target: Flushable) -> None:
        self._target = target
        self._stop = False
        if self.options.compiled_rounds and self._loop_gather <= 0:
            self._native = NativeRounds.create(self, target)
        for name, fn in (("group-commit", self._run), ("group-commit-reaper", self._reap)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def request(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = StoreFuture()
        self.submit(end_offset, fut, True, _false)
        return fut

    def submit(self, end_offset: int, fut: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        """Resolve ``fut`` with ``value`` once ``end_offset`` is flushed, ``on_timeout()`` if not in time.

        The store's fast path: its own future is resolved here, no second future per put.  From an
        event loop, ``fut`` joins the loop's batch of this iteration (a :class:`StoreFuture` also
        its shared completion); no lock is waited for and no thread woken per put.
        """
        target = self._target
        if target is None:
            raise RuntimeError("flush policy used before start()")
        self.requests += 1
        if end_offset <= target.flushed_where:
            fut.set_result(value)
            return
        loop = running_loop()
        with self._lock:
            if self._stop:
                fut.set_result(value if end_offset <= target.flushed_where else on_timeout())
                return
            if loop is None:  # a writer thread: a batch of its own, started now
                batch = _Batch(time.monotonic() + self._timeout, None)
                batch.add(end_offset, fut, value, on_timeout)
                self._pending.append(batch)
                self._ready = self._threaded = True
                self._cond.notify()
                return
            open_batch = self._open.get(loop)
            if open_batch is None:
                completion = SharedCompletion(loop)
                open_batch = self._open[loop] = _Batch(time.monotonic() + self._timeout, completion)
                # Runs after every callback already ready in this iteration: their puts join the batch.
                loop.call_soon(self._kick, loop)
            open_batch.add(end_offset, fut, value, on_timeout)
            if type(fut) is StoreFuture:
                # Not ``cast(StoreFuture[Any], fut)``: the subscript and the call cost
                # ~0.1 µs a put on the loop (sync128).
                fut.completion = open_batch.completion

    def _kick(self, loop: AbstractEventLoop) -> None:
        """On ``loop``, after the iteration whose puts scheduled it: flush their batch here when
        nothing else is in flight and the disk is fast (:meth:`_inline`), else hand it in."""
        with self._lock:
            batch = self._open.get(loop)
            if batch is None:  # the reaper handed it in already
                return
            native = self._native
            if (
                batch.polls < self._kick_polls
                and native is not None
                and not native.posted
                and not self._stop
                and not self._pending
                and not self._inflight
            ):
                # The worker is idle: a round of many messages (batched puts, a dense turn) waits
                # one more turn of the loop for the sends already arrived; a sparse one goes now.
                if _messages_reach(batch.values, self._kick_min_messages):
                    batch.polls += 1
                    self.kicks_held += 1
                    loop.call_soon(self._kick, loop)
                    return
                self.kicks_sparse += 1
            del self._open[loop]
            if not self._stop:
                if (
                    self._pending
                    or self._inflight
                    or (native is not None and native.posted)
                    or self._fast_streak < INLINE_AFTER_FAST
                    or len(batch.futures) > INLINE_MAX_PUTS
                    or batch.end - self._target.flushed_where > INLINE_MAX_BYTES  # type: ignore[union-attr]
                ):
                    if native is not None and native.take(loop, batch):
                        return  # the compiled worker's round: the loop's reader answers it
                    self._pending.append(batch)
                    self._ready = True
                    if not self._gathering or batch.end >= self._gather_to:
                        self._cond.notify()
                    return
                self._inflight = [batch]  # a round in flight: the next kicks hand theirs in
                inline = True
            else:
                inline = False
        if inline:
            self._inline(loop, batch)
            return
        target = self._target
        assert target is not None
        batch.time_out(target.flushed_where)  # stopped: shutdown() flushed everything it could

    def _inline(self, loop: AbstractEventLoop, batch: _Batch) -> None:
        """The round of one loop batch, on the loop (Redis' ``appendfsync always``: fsync, then
        reply): commit + ``fdatasync`` here, the puts resolved and their group completed at once,
        its callbacks (the held reads' answers) run now.  A flush that fails or does not cover the
        batch hands it to the flush thread, which retries until the batch's deadline."""
        target = self._target
        assert target is not None
        native = self._native
        if native is not None and native.here(loop, batch):
            # The compiled worker's round on this thread: its fdatasync without the GIL, the
            # answers through the same bookkeeping as its own rounds (no Python flush path).
            self.inline_rounds += 1
            with self._cond:
                self._inflight = []
            return
        try:
            retry = self._flush_and_resolve(target, [batch], loop)
        except Exception:
            retry = [batch]
            self._fast_streak = 0
            log.exception("inline flush failed")
        if not retry:
            self.inline_rounds += 1
        with self._cond:
            self._inflight = []
            if retry:
                self._pending[:0] = retry
                self._ready = True
                self._cond.notify()

    def round_stats(self) -> FlushRoundStats:
        """:class:`tidemq.flush.RoundStatistics`: how the rounds ran (runtime info, metrics)."""
        native = self._native
        worker = native.worker if native is not None else None
        return FlushRoundStats(
            inline=self.inline_rounds,
            compiled=native.rounds if native is not None else 0,
            gathered=self.gathered_rounds,
            gather_timeouts=self.gather_timeouts,
            kicks_held=self.kicks_held,
            kicks_sparse=self.kicks_sparse,
            worker_gathered=worker.gathered if worker is not None else 0,
            worker_gather_timeouts=worker.gather_timeouts if worker is not None else 0,
        )

    # ------------------------------------------------------------------ for the compiled rounds
    @property
    def lock(self) -> threading.Lock:
        """The policy's lock (pending batches, posted rounds): ``native_rounds`` takes it too."""
        return self._lock

    def requeue(self, batches: list[_Batch]) -> None:
        """Caller holds :attr:`lock`: the flush thread flushes (and retries) ``batches`` first."""
        self._pending[:0] = batches
        self._ready = True
        self._cond.notify()

    def round_failed(self) -> None:
        """A round's flush failed: no inline round until flushes succeed fast again."""
        self._fast_streak = 0

    def count_round(self, took: float) -> None:
        """Count a flush round that took ``took`` seconds (its speed decides inline rounds)."""
        self._fast_streak = self._fast_streak + 1 if took <= self._inline_max else 0
        self.flush_rounds += 1
        self.flush_seconds.observe(took)

    def round_done(self, took: float, requests: int) -> None:
        """Count a round that made ``requests`` puts durable in ``took`` seconds."""
        self.count_round(took)
        self._last_batch = requests
        self.batch_sizes.observe(requests)

    def _run(self) -> None:
        """Flush whatever is waiting, resolve it, repeat.

        Requests that queued up while an fdatasync ran are flushed as soon as it returns
        (RocketMQ's swap of request lists): that fdatasync was their batching window, so at a
        moderate rate a put waits for at most the rest of the flush in progress plus its own,
        never for a timer too.  Running writers may join first (``batch_wait_us``) only in a round
        that starts from idle, or while rounds carry :data:`GATHER_MIN_BATCH` requests or more
        (many closed-loop writers: each round's batch is the writers the previous one released,
        still putting; 32 writer threads lost ~20 % of their rate without it).  Rounds of event
        loop writers start at the loop's kick; after a round of :data:`GATHER_MIN_BATCH` loop puts
        or more the next one may wait for the senders that round released (``loop_gather_us``,
        :meth:`_next_gather`).
        """
        target = self._target
        assert target is not None
        cond = self._cond
        gather = self.options.batch_wait_us > 0
        while True:
            with cond:
                join = gather and (not self._pending or self._last_batch >= GATHER_MIN_BATCH)
                while not (self._ready and self._pending) and not self._stop:
                    cond.wait()
                if not self._pending:  # stopping, nothing left
                    return
                join = join and self._threaded
                if not join and self._gather_to and not self._stop:
                    self._gather_loops(cond)
                self._ready = self._threaded = False
                if not join:
                    batches, self._pending = self._pending, []
                    self._inflight = batches
            if join:
                self._gather()
                with cond:
                    batches, self._pending = self._pending, []
                    self._inflight = batches
                    self._ready = self._threaded = False
            retry = self._flush_and_resolve(target, batches)
            with cond:
                self._inflight = []
                self._gather_to = self._next_gather(target, batches)
                if retry:
                    self._pending[:0] = retry
                    self._ready = True
            if retry:
                time.sleep(0.001)  # the flush did not advance (it failed): do not spin

    def _flush_and_resolve(
        self, target: Flushable, batches: list[_Batch], here: AbstractEventLoop | None = None
    ) -> list[_Batch]:
        """One flush for ``batches``; resolves what it covered, returns the batches it did not.

        ``here``: called on that loop (an inline round): its groups complete at once, no hop."""
        max_end = max(b.end for b in batches)
        requests = sum(len(b.futures) for b in batches)
        self._last_batch = requests
        flushed = self._round_start = target.flushed_where
        started = time.perf_counter()
        try:
            # Two rounds at most: a batch may end in the file after the one being flushed.
            for _ in range(2):
                target.commit(0)
                flushed = target.flush(0)
                if flushed >= max_end:
                    break
            took = time.perf_counter() - started
            self._fast_streak = self._fast_streak + 1 if took <= self._inline_max else 0
            self.flush_rounds += 1
            self.flush_seconds.observe(took)
            self.batch_sizes.observe(requests)
        except Exception:
            self._fast_streak = 0  # no inline round until flushes succeed fast again
            log.exception("flush failed")
        completions: list[SharedCompletion] = []
        if flushed >= max_end:
            for batch in batches:
                batch.resolve(completions)
            if here is not None:
                complete_here(completions, here)  # on the loop: its callbacks run now
            else:
                complete_all(completions)  # one hop into the loop for the whole round
            return []
        now = time.monotonic()
        retry = []
        for batch in batches:
            if flushed >= batch.end:
                batch.resolve(completions)
            elif now >= batch.deadline:
                batch.time_out(flushed)
            else:
                retry.append(batch)
        if here is not None:
            complete_here(completions, here)
        else:
            complete_all(completions)
        return retry

    def _next_gather(self, target: Flushable, batches: list[_Batch]) -> int:
        """Where the next round should gather to (0: start at once); under the lock, after a round.

        A round of :data:`GATHER_MIN_BATCH` loop requests or more (many closed-loop senders) waits
        for as many bytes as this round flushed plus what was pending when it ended: the senders
        it released answer within a round trip, and one ``fdatasync`` then covers both cohorts
        instead of one each."""
        if self._loop_gather <= 0 or self._last_batch < GATHER_MIN_BATCH:
            return 0
        if self._gather_skip > 0:
            self._gather_skip -= 1
            return 0
        if any(batch.completion is None for batch in batches):  # writer threads: their own gathering
            return 0
        start = self._round_start
        end = max(batch.end for batch in batches)
        pending = max((batch.end for batch in self._pending), default=end)
        flushed = target.flushed_where
        return flushed + (max(end, pending) - start) if flushed >= end else 0

    def _gather_loops(self, cond: threading.Condition) -> None:
        """Under ``cond``: wait until the pending loop batches reach :attr:`_gather_to` (each
        kick that does notifies), at most ``loop_gather_us``."""
        want = self._gather_to
        if max(batch.end for batch in self._pending) >= want:
            self._gather_to = 0
            return
        started = time.monotonic()
        deadline = started + self._loop_gather
        self._gathering = True  # kicks below the target do not wake this thread
        try:
            while not self._stop:
                left = deadline - time.monotonic()
                if left <= 0 or max(batch.end for batch in self._pending) >= want:
                    break
                cond.wait(left)
        finally:
            self._gathering = False
        reached = max(batch.end for batch in self._pending) >= want
        self._gather_to = 0
        self.gathered_rounds += 1
        self.gather_seconds += time.monotonic() - started
        if reached:
            self._gather_misses = 0
            self._gather_backoff = GATHER_SKIP_AFTER_MISS
        else:
            self.gather_timeouts += 1
            self._gather_misses += 1
            if self._gather_misses >= GATHER_MISSES:
                # The senders keep not coming back in time: do not wait for a while, longer each time.
                self._gather_misses = 0
                self._gather_skip = self._gather_backoff
                self._gather_backoff = min(self._gather_backoff * 2, GATHER_SKIP_MAX)

    def _gather(self) -> None:
        """Yield the GIL while writers keep adding requests (bounded by batch_wait_us).

        Stops once no request has arrived for ``batch_idle_us``: every writer that was running
        has joined, and the ones still waiting for their previous flush cannot.
        """
        window = self.options.batch_wait_us / 1e6
        if window <= 0:
            return
        start = time.monotonic()
        deadline = start + window
        # A lone writer (the last round served one request) gets one yield, not the idle wait.
        idle = self.options.batch_idle_us / 1e6 if self._last_batch > 1 else 0.0
        seen = len(self._pending)
        last_new = start
        while True:
            # idle 0: one yield, done at the first quiet one (a lone writer pays one thread switch).
            time.sleep(idle / 2)
            now = time.monotonic()
            count = len(self._pending)
            if count != seen:
                seen, last_new = count, now
            elif now - last_new >= idle or now >= deadline:
                return

    def _reap(self) -> None:
        """Resolve overdue batches; hand in a batch whose kick never ran (a loop blocked in
        ``result()`` on its own put cannot run it) and start a round nobody started: within two
        steps of the reaper."""
        step = min(0.1, self._timeout / 10)
        stale: _Batch | None = None
        stale_open: set[_Batch] = set()
        target = self._target
        assert target is not None
        while not self._stop:
            time.sleep(step)
            now = time.monotonic()
            with self._cond:
                for loop, batch in list(self._open.items()):
                    if batch in stale_open:
                        log.debug("group commit: a batch was not kicked by its loop; handing it in")
                        del self._open[loop]
                        self._pending.append(batch)
                        self._ready = True
                        self._cond.notify()
                stale_open = set(self._open.values())
                waiting = self._pending + self._inflight + list(self._open.values())
                if self._native is not None:
                    waiting += self._native.batches()
                first = self._pending[0] if self._pending else None
                if first is not None and first is stale and not self._ready:
                    log.debug("group commit: a round was not started; starting it")
                    self._ready = True
                    self._cond.notify()
                stale = first
            for batch in waiting:
                if now >= batch.deadline and not batch.settled:
                    log.warning("flush did not finish within %d ms", self.options.timeout_ms)
                    batch.time_out(target.flushed_where)

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=self._timeout + 5)
        self._threads = []
        native, self._native = self._native, None
        posted = native.close(self._timeout + 5) if native is not None else []
        if self._target is not None:
            self._target.commit(0)
            flushed = self._target.flush(0)
            with self._lock:
                left, self._open = list(self._open.values()), {}
                left += posted
                left += self._pending
                self._pending = []
            for batch in left:  # put since the flush thread stopped: durable now, or never will be
                batch.time_out(flushed)
