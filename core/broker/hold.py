"""Long polling (PullRequestHoldService): pulls that found nothing wait here for an arrival.

The store calls :meth:`PullRequestHoldService.notify_arrival` from its own thread after messages
become readable; it hops to the event loop with ``call_soon_threadsafe`` only when someone waits on
that queue, and the waiting pulls re-read the store.  A pull that registers after the arrival
re-checks the queue's max offset itself, so no wake-up is lost between its read and its wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tidemq.store import ArrivalInterest, MessageStore, arrival_interest
from tidemq.transport import Connection

log = logging.getLogger(__name__)

Key = tuple[str, int]


class PullRequestHoldService:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        max_offset: Callable[[str, int], int],
        bounded: bool = False,
    ):
        self._loop = loop
        #: The queue's readable end (bounded by the confirm offset when ``bounded``).
        self._max_offset = max_offset
        #: An arrival's max offset may be past the readable end (the confirm offset): the readable
        #: end is read instead, on the store's thread, and the loop is woken only for pulls below
        #: it; the confirm offset's growth calls :meth:`recheck`.
        self._bounded = bounded
        self._waiters: dict[Key, list[tuple[int, asyncio.Future[bool]]]] = {}
        # Held pulls by connection: released when it closes (nobody is left to answer).
        self._by_conn: dict[Any, set[asyncio.Future[bool]]] = {}
        self._stopped = False
        #: The store's one map of waited-on queues (:meth:`listen`), when it has one.
        self._interest: ArrivalInterest | None = None

    def listen(self, store: MessageStore) -> None:
        """Register as ``store``'s arrival listener (before any pull is held).

        A store with one map of waited-on queues (:func:`tidemq.store.arrival_interest`) gets
        each held queue registered there (one lookup per put for all the broker's listeners);
        another store asks :meth:`is_waited_on` per arrival, as before.
        """
        shared = arrival_interest(store)
        if shared is None:
            store.add_arrival_listener(self.notify_arrival, self.is_waited_on)
            return
        for topic, queue_id in list(self._waiters):
            shared.watch_queue(topic, queue_id)
        self._interest = shared
        store.add_arrival_listener(self.notify_arrival, shared)

    @property
    def waiting(self) -> int:
        return sum(len(v) for v in self._waiters.values())

    def held_by(self, conn: Connection) -> int:
        """Pulls of ``conn`` held right now."""
        held = self._by_conn.get(conn)
        return len(held) if held is not None else 0

    def connection_closed(self, conn: Connection) -> None:
        """Release every pull ``conn`` has held (a close callback of the connection)."""
        for fut in self._by_conn.pop(conn, ()):
            if not fut.done():
                fut.set_result(False)

    async def wait(
        self, topic: str, queue_id: int, offset: int, timeout_s: float, conn: Connection | None = None
    ) -> bool:
        """Wait until the queue holds a message at ``offset`` or later; False on timeout.

        With ``conn``, the wait ends (False) as soon as that connection closes.
        """
        if self._stopped or timeout_s <= 0 or (conn is not None and conn.closed):
            return False
        key = (topic, queue_id)
        fut: asyncio.Future[bool] = self._loop.create_future()
        entry = (offset, fut)
        queued = self._waiters.get(key)
        if queued is None:
            queued = self._waiters[key] = []
            if self._interest is not None:  # before the max offset's re-read below
                self._interest.watch_queue(topic, queue_id)
        queued.append(entry)
        if conn is not None:
            held = self._by_conn.get(conn)
            if held is None:
                held = self._by_conn[conn] = set()
                conn.add_close_callback(self.connection_closed)
            held.add(fut)
        try:
            if self._max_offset(topic, queue_id) > offset:
                return True
            try:
                return await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                return False
        finally:
            if conn is not None:
                held = self._by_conn.get(conn)
                if held is not None:
                    held.discard(fut)
                    # An empty set stays until the connection closes: its close callback is
                    # registered once per connection, not once per held pull.
            waiters = self._waiters.get(key)
            if waiters is not None:
                try:
                    waiters.remove(entry)
                except ValueError:
                    pass
                if not waiters:
                    del self._waiters[key]
                    if self._interest is not None:
                        self._interest.unwatch_queue(topic, queue_id)

    def is_waited_on(self, topic: str, queue_id: int) -> bool:
        """Whether a pull is held on the queue: the store's arrival filter (any thread; no lock).

        A pull registers before it re-reads the max offset, so an arrival this answers False for
        is seen by that re-read.
        """
        return (topic, queue_id) in self._waiters

    def notify_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store's arrival listener; safe to call from any thread."""
        if (topic, queue_id) not in self._waiters:  # a dict lookup is atomic; no waiter, no hop
            return
        if self._bounded:
            readable = self._max_offset(topic, queue_id)
            if not any(offset < readable for offset, _ in list(self._waiters.get((topic, queue_id), ()))):
                return  # not readable yet: recheck() runs when the in-sync set acknowledges it
            max_offset = readable
        try:
            self._loop.call_soon_threadsafe(self._wake, topic, queue_id, max_offset)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _wake(self, topic: str, queue_id: int, max_offset: int) -> None:
        for offset, fut in list(self._waiters.get((topic, queue_id), ())):
            if offset < max_offset and not fut.done():
                fut.set_result(True)

    def has_waiters(self) -> bool:
        """Whether any pull is held (any thread; no lock)."""
        return bool(self._waiters)

    def recheck(self) -> None:
        """The readable end moved (the confirm offset grew): wake the pulls now below it (loop thread)."""
        for topic, queue_id in list(self._waiters):
            self._wake(topic, queue_id, self._max_offset(topic, queue_id))

    def stop(self) -> None:
        """Answer every held pull now (with what the store has) so shutdown does not wait 15 s."""
        self._stopped = True
        for waiters in list(self._waiters.values()):
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(False)
