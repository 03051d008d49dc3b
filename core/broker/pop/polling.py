"""Held POPs and NOTIFICATIONs: they wait for an arrival in a topic (or a FIFO queue to free up).

The store calls :meth:`PopWaiters.on_arrival` from its own thread; it hops to the event loop only
when someone waits on that topic.
"""

from __future__ import annotations

import asyncio


class PopWaiters:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[bool]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def total(self) -> int:
        return sum(len(v) for v in self._waiters.values())

    def is_waited_on(self, topic: str, queue_id: int) -> bool:
        """The store's arrival filter (any thread; a dict lookup)."""
        return topic in self._waiters

    def on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store's arrival listener; safe from any thread."""
        if topic not in self._waiters or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self.notify, topic)
        except RuntimeError:  # the loop closed during shutdown
            pass

    def notify(self, topic: str) -> None:
        for fut in self._waiters.get(topic, ()):
            if not fut.done():
                fut.set_result(True)

    def has_waiters(self) -> bool:
        """Whether a request is held (any thread; no lock)."""
        return bool(self._waiters)

    def notify_all(self) -> None:
        """Wake every held request (the readable end moved: the confirm offset grew)."""
        for topic in list(self._waiters):
            self.notify(topic)

    async def wait(self, topics: list[str], timeout_s: float) -> bool:
        """Until something arrives in one of ``topics`` (True) or ``timeout_s`` passes (False)."""
        if timeout_s <= 0 or self._loop is None:
            return False
        fut: asyncio.Future[bool] = self._loop.create_future()
        for t in topics:
            self._waiters.setdefault(t, set()).add(fut)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        finally:
            for t in topics:
                waiting = self._waiters.get(t)
                if waiting is not None:
                    waiting.discard(fut)
                    if not waiting:
                        del self._waiters[t]

    def count(self, topic: str) -> int:
        return len(self._waiters.get(topic, ()))

    def release_all(self) -> None:
        """Answer every held request now (shutdown)."""
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(False)
