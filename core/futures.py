"""Awaiting the store's futures from an event loop.

The store resolves its :class:`concurrent.futures.Future` on whichever thread made the data
durable (the group-commit thread under sync flush), usually many at once.
``asyncio.wrap_future`` wakes the loop once per future (a write to the loop's self-pipe, a
callback hop and two chained futures each); :func:`resolved` queues results per loop and wakes it
once per burst, so a flush that acknowledges 32 writers costs one wake-up, not 32.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")


class _LoopWaker:
    """Delivers results of futures resolved on other threads into one event loop, in batches."""

    __slots__ = ("__weakref__", "_armed", "_lock", "_loop", "_ready")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Future[Any]]] = []
        self._armed = False  # a drain is scheduled and will see what is queued

    def bridge(self, future: Future[T]) -> asyncio.Future[T]:
        waiter: asyncio.Future[T] = self._loop.create_future()
        future.add_done_callback(partial(self._done, waiter))
        return waiter

    def _done(self, waiter: asyncio.Future[Any], future: Future[Any]) -> None:
        """Runs on the resolving thread."""
        with self._lock:
            self._ready.append((waiter, future))
            if self._armed:
                return
            self._armed = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._armed = False
        for waiter, future in ready:
            if waiter.done():  # the awaiting task was cancelled
                continue
            if future.cancelled():
                waiter.cancel()
                continue
            exc = future.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(future.result())


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = weakref.WeakKeyDictionary()


async def resolved(future: Future[T]) -> T:
    """The result of a concurrent future: at once when it is done (the usual case), else awaited."""
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    return await waker.bridge(future)
