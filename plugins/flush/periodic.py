"""The ``async`` flush policy: periodic flushing (RocketMQ's FlushRealTimeService).

Writers are acknowledged as soon as their bytes are in the page cache; a thread flushes every
``interval_ms`` when at least ``least_pages`` pages are dirty, and flushes everything every
``thorough_interval_ms``.  With the store's transient store pool the same thread first commits
the off-map buffer into the mapped files every ``commit_interval_ms`` (CommitRealTimeService).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import attrs

from tidemq.flush import Flushable
from tidemq.metrics import Buckets
from tidemq.threads import name_this_thread

log = logging.getLogger(__name__)


def _positive(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def _not_negative(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative, got {value!r}")


@attrs.define
class AsyncFlushOptions:
    """``[flush.async]`` (flushIntervalCommitLog, flushCommitLogLeastPages, ...)."""

    interval_ms: int = attrs.field(default=500, validator=_positive)
    least_pages: int = attrs.field(default=4, validator=_not_negative)
    thorough_interval_ms: int = attrs.field(default=10_000, validator=_positive)
    commit_interval_ms: int = attrs.field(default=200, validator=_positive)
    commit_least_pages: int = attrs.field(default=4, validator=_not_negative)
    commit_thorough_interval_ms: int = attrs.field(default=200, validator=_positive)


class PeriodicFlush:
    """Acknowledges immediately; flushes in the background."""

    def __init__(self, options: AsyncFlushOptions | None = None):
        self.options = options or AsyncFlushOptions()
        self._target: Flushable | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done: Future[bool] = Future()
        self._done.set_result(True)
        self.flush_rounds = 0
        self.requests = 0
        #: Seconds per flush that wrote something (fdatasync of the commit log).
        self.flush_seconds = Buckets()
        #: No group commit here (FlushStatistics): every put is acknowledged before its flush.
        self.batch_sizes: Buckets | None = None

    def start(self, target: Flushable) -> None:
        self._target = target
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flush-async", daemon=True)
        self._thread.start()

    def request(self, end_offset: int) -> Future[bool]:
        # One shared, already-resolved future: the hot path allocates nothing.
        return self._done

    def submit(self, end_offset: int, fut: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        """The store's fast path: acknowledged at once (durability comes with the next flush)."""
        fut.set_result(value)

    def _run(self) -> None:
        name_this_thread()
        target = self._target
        assert target is not None
        o = self.options
        now = time.monotonic()
        next_flush = now + o.interval_ms / 1000
        next_commit = now + o.commit_interval_ms / 1000
        last_thorough_flush = last_thorough_commit = now
        tick = min(o.interval_ms, o.commit_interval_ms) / 1000
        while not self._stop.wait(tick):
            now = time.monotonic()
            try:
                if now >= next_commit:
                    next_commit = now + o.commit_interval_ms / 1000
                    thorough = now - last_thorough_commit >= o.commit_thorough_interval_ms / 1000
                    if thorough:
                        last_thorough_commit = now
                    target.commit(0 if thorough else o.commit_least_pages)
                if now >= next_flush:
                    next_flush = now + o.interval_ms / 1000
                    thorough = now - last_thorough_flush >= o.thorough_interval_ms / 1000
                    if thorough:
                        last_thorough_flush = now
                    before = target.flushed_where
                    started = time.perf_counter()
                    if target.flush(0 if thorough else o.least_pages) != before:
                        self.flush_rounds += 1
                        self.flush_seconds.observe(time.perf_counter() - started)
            except Exception:
                log.exception("periodic flush failed")

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._target is not None:
            self._target.commit(0)
            self._target.flush(0)
