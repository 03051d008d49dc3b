"""The ``sync`` flush policy: group commit (RocketMQ's GroupCommitService).

Writers hand in the offset their bytes end at and get a future.  One thread takes every request
waiting, flushes once (fdatasync releases the GIL, so writers keep appending meanwhile) and
resolves all requests the flush covered together.  A request still not covered after
``timeout_ms`` resolves ``False`` (the store reports FLUSH_DISK_TIMEOUT), even while the flush
itself is stuck in the kernel: a small reaper thread watches the deadlines.

A writer on an event loop (the broker: every send is put from its loop) does not wake the flush
thread per put: its first put of a loop iteration schedules one *kick* at the end of that iteration
(``call_soon``), so the puts of one iteration start one round together and the flush thread wakes
once per round, not per message; no gathering wait (``batch_wait_us``) is needed for them.  The
results reach the loop through :func:`tidemq.futures.resolved`, one wake-up per round.  A round
whose kick never runs (its loop blocked in ``result()`` on its own put) is started by the reaper.
Writer threads (tests, benches, the threaded clients) wake it per put as before and may gather.
"""

from __future__ import annotations

import logging
import threading
import time
from asyncio import AbstractEventLoop
from asyncio import _get_running_loop as running_loop
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import attrs

from tidemq.flush import Flushable
from tidemq.metrics import BATCH_BOUNDS, Buckets

log = logging.getLogger(__name__)

#: A round whose predecessor flushed at least this many requests lets running writers join
#: before it flushes (when ``batch_wait_us`` > 0); smaller ones flush what is waiting at once.
GATHER_MIN_BATCH = 8


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


def _resolve(fut: Future[Any], value: Any) -> None:
    try:
        fut.set_result(value)
    except InvalidStateError:  # the reaper or the flusher got there first
        pass


def _false() -> bool:
    return False


#: A waiting writer: (end offset, deadline, future, value when durable, value on timeout).
_Waiter = tuple[int, float, Future[Any], Any, Callable[[], Any]]


class GroupCommitFlush:
    """Batches waiting writers behind one flush."""

    def __init__(self, options: SyncFlushOptions | None = None):
        self.options = options or SyncFlushOptions()
        self._timeout = self.options.timeout_ms / 1000
        self._cond = threading.Condition()
        self._pending: list[_Waiter] = []
        self._inflight: list[_Waiter] = []
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
        #: Loops with a kick scheduled (one per loop iteration that put something).
        self._kicks: set[AbstractEventLoop] = set()

    def start(self, target: Flushable) -> None:
        self._target = target
        self._stop = False
        for name, fn in (("group-commit", self._run), ("group-commit-reaper", self._reap)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def request(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = Future()
        self.submit(end_offset, fut, True, _false)
        return fut

    def submit(self, end_offset: int, fut: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        """Resolve ``fut`` with ``value`` once ``end_offset`` is flushed, ``on_timeout()`` if not in time.

        The store's fast path: its own future is resolved here, no second future per put.
        """
        target = self._target
        if target is None:
            raise RuntimeError("flush policy used before start()")
        self.requests += 1
        if end_offset <= target.flushed_where:
            fut.set_result(value)
            return
        loop = running_loop()
        kick: AbstractEventLoop | None = None
        with self._cond:
            if self._stop:
                fut.set_result(value if end_offset <= target.flushed_where else on_timeout())
                return
            self._pending.append((end_offset, time.monotonic() + self._timeout, fut, value, on_timeout))
            if loop is None:
                self._ready = self._threaded = True
                self._cond.notify()
            elif loop not in self._kicks:
                self._kicks.add(loop)
                kick = loop
        if kick is not None:
            # Runs after every callback already ready in this iteration: their puts join the round.
            kick.call_soon(self._kick, kick)

    def _kick(self, loop: AbstractEventLoop) -> None:
        """On ``loop``, after the iteration whose puts scheduled it: start their round."""
        with self._cond:
            self._kicks.discard(loop)
            self._ready = True
            self._cond.notify()

    def _run(self) -> None:
        """Flush whatever is waiting, resolve it, repeat.

        Requests that queued up while an fdatasync ran are flushed as soon as it returns
        (RocketMQ's swap of request lists): that fdatasync was their batching window, so at a
        moderate rate a put waits for at most the rest of the flush in progress plus its own,
        never for a timer too.  Running writers may join first (``batch_wait_us``) only in a round
        that starts from idle, or while rounds carry :data:`GATHER_MIN_BATCH` requests or more
        (many closed-loop writers: each round's batch is the writers the previous one released,
        still putting; 32 writer threads lost ~20 % of their rate without it).  Rounds of event
        loop writers start at the loop's kick and never gather (the kick is their gathering).
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
                self._ready = self._threaded = False
                if not join:
                    batch, self._pending = self._pending, []
                    self._inflight = batch
            if join:
                self._gather()
                with cond:
                    batch, self._pending = self._pending, []
                    self._inflight = batch
                    self._ready = self._threaded = False
            self._last_batch = len(batch)
            retry = self._flush_and_resolve(target, batch)
            with cond:
                self._inflight = []
                if retry:
                    self._pending[:0] = retry
                    self._ready = True
            if retry:
                time.sleep(0.001)  # the flush did not advance (it failed): do not spin

    def _flush_and_resolve(self, target: Flushable, batch: list[_Waiter]) -> list[_Waiter]:
        """One flush for ``batch``; resolves what it covered, returns the waiters it did not."""
        max_end = max(w[0] for w in batch)
        flushed = target.flushed_where
        started = time.perf_counter()
        try:
            # Two rounds at most: a batch may end in the file after the one being flushed.
            for _ in range(2):
                target.commit(0)
                flushed = target.flush(0)
                if flushed >= max_end:
                    break
            self.flush_rounds += 1
            self.flush_seconds.observe(time.perf_counter() - started)
            self.batch_sizes.observe(len(batch))
        except Exception:
            log.exception("flush failed")
        if flushed >= max_end:
            for waiter in batch:
                _resolve(waiter[2], waiter[3])
            return []
        now = time.monotonic()
        retry = []
        for waiter in batch:
            end, deadline, fut, value, on_timeout = waiter
            if flushed >= end:
                _resolve(fut, value)
            elif now >= deadline:
                if not fut.done():
                    _resolve(fut, on_timeout())
            else:
                retry.append(waiter)
        return retry

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
        """Resolve overdue requests; start a round that no kick started (a loop blocked in
        ``result()`` on its own put cannot run its kick): within two steps of the reaper."""
        step = min(0.1, self._timeout / 10)
        stale: _Waiter | None = None
        while not self._stop:
            time.sleep(step)
            now = time.monotonic()
            with self._cond:
                waiting = self._pending + self._inflight
                first = self._pending[0] if self._pending else None
                if first is not None and first is stale and not self._ready:
                    log.debug("group commit: a round was not kicked by its loop; starting it")
                    self._ready = True
                    self._cond.notify()
                stale = first
            for _, deadline, fut, _value, on_timeout in waiting:
                if now >= deadline and not fut.done():
                    log.warning("flush did not finish within %d ms", self.options.timeout_ms)
                    _resolve(fut, on_timeout())

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=self._timeout + 5)
        self._threads = []
        if self._target is not None:
            self._target.commit(0)
            self._target.flush(0)
