"""Held POPs and NOTIFICATIONs: they wait for an arrival in a topic (or a FIFO queue to free up).

The store calls :meth:`PopWaiters.on_arrival` from its own thread; it hops to the event loop only
when someone waits on that topic.  The confirm offset's growth (an HA reader thread, in controller
mode) calls :meth:`PopWaiters.notify_all` the same way, only while :meth:`PopWaiters.has_waiters`.

A request registers (:meth:`PopWaiters.watch`) *before* the read whose outcome decides whether it
waits, and waits on that registration (:meth:`PopWaiters.until`): an arrival or an acknowledgement
that comes after the read found nothing, but before the wait began, then finds the request
registered and wakes it (registered after the read, the other thread saw no waiter and the request
slept its whole poll time with a readable message; a client's POP long poll is 20 s).
"""

from __future__ import annotations

import asyncio

from tidemq.store import ArrivalInterest, MessageStore, arrival_interest


class Watch:
    """One request's registration on its topics (:meth:`PopWaiters.watch`)."""

    __slots__ = ("fut", "topics")

    def __init__(self, fut: asyncio.Future[bool], topics: list[str]) -> None:
        self.fut = fut
        self.topics = topics


class PopWaiters:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[bool]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The store's one map of waited-on queues (:meth:`listen`), when it has one.
        self._interest: ArrivalInterest | None = None

    def listen(self, store: MessageStore) -> None:
        """Register as ``store``'s arrival listener: each watched topic in the store's one map of
        waited-on queues when it has one (:func:`tidemq.store.arrival_interest`), else
        :meth:`is_waited_on` asked per arrival, as before."""
        shared = arrival_interest(store)
        if shared is None:
            store.add_arrival_listener(self.on_arrival, self.is_waited_on)
            return
        for topic in list(self._waiters):
            shared.watch_topic(topic)
        self._interest = shared
        store.add_arrival_listener(self.on_arrival, shared)

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

    def watch(self, topics: list[str]) -> Watch | None:
        """Register a request on ``topics`` (distinct) before it reads (loop thread); None before
        :meth:`bind`.

        Every :meth:`notify` of one of them from now on sets it; :meth:`unwatch` it after.
        """
        if self._loop is None:
            return None
        fut: asyncio.Future[bool] = self._loop.create_future()
        waiters = self._waiters
        for t in topics:
            got = waiters.get(t)
            if got is None:
                waiters[t] = {fut}
                if self._interest is not None:  # before the caller's read
                    self._interest.watch_topic(t)
            else:
                got.add(fut)
        return Watch(fut, topics)

    def unwatch(self, watch: Watch) -> None:
        waiters, fut = self._waiters, watch.fut
        for t in watch.topics:
            waiting = waiters.get(t)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del waiters[t]
                    if self._interest is not None:
                        self._interest.unwatch_topic(t)

    async def until(self, watch: Watch, timeout_s: float) -> bool:
        """Until one of the watched topics was notified since :meth:`watch` (True, at once if it
        already was) or ``timeout_s`` passes (False)."""
        fut = watch.fut
        if fut.done():
            return fut.result()
        if timeout_s <= 0:
            return False
        try:
            return await asyncio.wait_for(fut, timeout_s)  # cancelled on timeout: watched once
        except TimeoutError:
            return False

    async def wait(self, topics: list[str], timeout_s: float) -> bool:
        """Until something arrives in one of ``topics`` (True) or ``timeout_s`` passes (False).

        Registers now: what arrived before the call is not seen (read after :meth:`watch`
        instead, then :meth:`until`)."""
        if timeout_s <= 0:
            return False
        watch = self.watch(topics)
        if watch is None:
            return False
        try:
            return await self.until(watch, timeout_s)
        finally:
            self.unwatch(watch)

    def count(self, topic: str) -> int:
        return len(self._waiters.get(topic, ()))

    def release_all(self) -> None:
        """Answer every held request now (shutdown)."""
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(False)
