"""The ``sync`` flush policy: group commit (RocketMQ's GroupCommitService).

Writers hand in the offset their bytes end at and get a future.  One thread takes every request
waiting, flushes once (fdatasync releases the GIL, so writers keep appending meanwhile) and
resolves all requests the flush covered together.  A request still not covered after
``timeout_ms`` resolves ``False`` (the store reports FLUSH_DISK_TIMEOUT), even while the flush
itself is stuck in the kernel: a small reaper thread watches the deadlines.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError

import attrs

from tidemq.flush import Flushable

log = logging.getLogger(__name__)


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


def _resolve(fut: Future[bool], value: bool) -> None:
    try:
        fut.set_result(value)
    except InvalidStateError:  # the reaper or the flusher got there first
        pass


class GroupCommitFlush:
    """Batches waiting writers behind one flush."""

    def __init__(self, options: SyncFlushOptions | None = None):
        self.options = options or SyncFlushOptions()
        self._timeout = self.options.timeout_ms / 1000
        self._cond = threading.Condition()
        self._pending: list[tuple[int, float, Future[bool]]] = []
        self._inflight: list[tuple[int, float, Future[bool]]] = []
        self._target: Flushable | None = None
        self._stop = False
        self._threads: list[threading.Thread] = []
        #: Flush rounds that wrote something, and requests served: their ratio is the batching.
        self.flush_rounds = 0
        self.requests = 0

    def start(self, target: Flushable) -> None:
        self._target = target
        self._stop = False
        for name, fn in (("group-commit", self._run), ("group-commit-reaper", self._reap)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def request(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = Future()
        target = self._target
        if target is None:
            raise RuntimeError("flush policy used before start()")
        self.requests += 1
        if end_offset <= target.flushed_where:
            fut.set_result(True)
            return fut
        with self._cond:
            if self._stop:
                fut.set_result(end_offset <= target.flushed_where)
                return fut
            self._pending.append((end_offset, time.monotonic() + self._timeout, fut))
            self._cond.notify()
        return fut

    def _run(self) -> None:
        target = self._target
        assert target is not None
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if self._stop and not self._pending:
                    return
            self._gather()
            with self._cond:
                batch, self._pending = self._pending, []
                self._inflight = batch
            max_end = max(e for e, _, _ in batch)
            flushed = target.flushed_where
            try:
                # Two rounds at most: a batch may end in the file after the one being flushed.
                for _ in range(2):
                    target.commit(0)
                    flushed = target.flush(0)
                    if flushed >= max_end:
                        break
                self.flush_rounds += 1
            except Exception:
                log.exception("flush failed")
            now = time.monotonic()
            retry = []
            for end, deadline, fut in batch:
                if flushed >= end:
                    _resolve(fut, True)
                elif now >= deadline:
                    _resolve(fut, False)
                else:
                    retry.append((end, deadline, fut))
            with self._cond:
                self._inflight = []
                if retry:
                    self._pending[:0] = retry
            if retry:
                time.sleep(0.001)  # the flush did not advance: do not spin

    def _gather(self) -> None:
        """Yield the GIL while runnable writers keep adding requests (bounded by batch_wait_us)."""
        window = self.options.batch_wait_us / 1e6
        if window <= 0:
            return
        deadline = time.monotonic() + window
        seen = len(self._pending)
        while time.monotonic() < deadline:
            time.sleep(0)
            now = len(self._pending)
            if now == seen:
                return
            seen = now

    def _reap(self) -> None:
        step = min(0.1, self._timeout / 10)
        while not self._stop:
            time.sleep(step)
            now = time.monotonic()
            with self._cond:
                waiting = self._pending + self._inflight
            for _, deadline, fut in waiting:
                if now >= deadline and not fut.done():
                    log.warning("flush did not finish within %d ms", self.options.timeout_ms)
                    _resolve(fut, False)

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
