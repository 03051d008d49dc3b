"""Arrivals: the store noting that a queue became readable, and who waits for it.

RocketMQ's ReputMessageService hands each dispatched message to its MessageArrivingListener (the
broker's long polling).  Here a store's writer notes ``(topic, queue id) -> readable max offset``
with :meth:`ArrivalNotifier.arrived` under the store's lock, and the notifier's thread calls the
listeners in rounds.  An arrival nobody waits on is dropped in the writer, so the question "does
anyone wait on this queue?" is asked once per put.

:class:`ArrivalInterest` (issue 38, groupdispatch) makes that question one dict lookup: the
broker's four listeners (long polling, POP, the schedule and the timer services) register what
they wait on (whole topics, single queues) in the store's one map instead of each answering a
call per put; a store offers it through :class:`ArrivalInterests` (:func:`arrival_interest`).  A
listener registered with a callable ``interested`` (a third-party one) is still asked per arrival
that the map does not cover.  Re-exported by :mod:`tidemq.store`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol, cast, runtime_checkable

from tidemq.threads import name_this_thread

if TYPE_CHECKING:
    from tidemq.store import MessageStore

log = logging.getLogger(__name__)

#: Shortest time between two rounds of arrival listeners (long-polling wake-ups) under load.
ARRIVAL_ROUND_S = 0.001

#: A value of :attr:`ArrivalInterest.waited`: every queue of the topic is waited on.
EVERY_QUEUE: Literal[True] = True

#: What :attr:`ArrivalInterest.waited` holds for a topic: :data:`EVERY_QUEUE` or the queue ids.
Waited = Literal[True] | frozenset[int]


class ArrivalInterest:
    """The queues a store's arrival listeners wait on, as one map (one lookup per arrival).

    :attr:`waited` maps a topic to :data:`EVERY_QUEUE` (``True``) or the frozenset of its queue
    ids someone waits on; a topic nobody waits on is absent.  Registrations are counted (two
    waiters on one queue, or a long-polling pull and a POP on one topic, each take theirs back).
    Mutated by the listeners' owners (the event loop's thread; a lock keeps two owners apart),
    read by writers without a lock: each change replaces one entry of :attr:`waited` whole (a dict
    store is atomic under the GIL).

    Ordering (why no arrival is lost): a waiter registers here *before* it re-reads the queue's max
    offset; a writer publishes its entries before it looks here.  Either the writer sees the
    registration (and notes the arrival), or the waiter's re-read sees the entries.

    Callable as ``interested(topic, queue_id)``: a store without the capability takes it as any
    listener's filter.
    """

    __slots__ = ("_lock", "_queues", "_topics", "waited")

    def __init__(self) -> None:
        self.waited: dict[str, Waited] = {}
        self._topics: dict[str, int] = {}
        self._queues: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, topic: str, queue_id: int) -> bool:
        return self.wants(topic, queue_id)

    def wants(self, topic: str, queue_id: int) -> bool:
        """Whether some listener waits on ``topic``/``queue_id`` (any thread; no lock)."""
        w = self.waited.get(topic)
        return w is not None and (w is True or queue_id in w)

    def watch_topic(self, topic: str) -> None:
        """Every queue of ``topic`` is waited on (until as many :meth:`unwatch_topic`)."""
        with self._lock:
            self._topics[topic] = self._topics.get(topic, 0) + 1
            self._publish(topic)

    def unwatch_topic(self, topic: str) -> None:
        with self._lock:
            n = self._topics.get(topic, 0) - 1
            if n > 0:
                self._topics[topic] = n
            else:
                self._topics.pop(topic, None)
            self._publish(topic)

    def watch_queue(self, topic: str, queue_id: int) -> None:
        """``topic``/``queue_id`` is waited on (until as many :meth:`unwatch_queue`)."""
        with self._lock:
            queues = self._queues.setdefault(topic, {})
            queues[queue_id] = queues.get(queue_id, 0) + 1
            self._publish(topic)

    def unwatch_queue(self, topic: str, queue_id: int) -> None:
        with self._lock:
            queues = self._queues.get(topic)
            if queues is not None:
                n = queues.get(queue_id, 0) - 1
                if n > 0:
                    queues[queue_id] = n
                else:
                    queues.pop(queue_id, None)
                    if not queues:
                        del self._queues[topic]
            self._publish(topic)

    def _publish(self, topic: str) -> None:
        """Replace ``topic``'s entry of :attr:`waited` whole (the lock held)."""
        if topic in self._topics:
            self.waited[topic] = EVERY_QUEUE
        elif topic in self._queues:
            self.waited[topic] = frozenset(self._queues[topic])
        else:
            self.waited.pop(topic, None)


@runtime_checkable
class ArrivalInterests(Protocol):
    """A store whose arrival filter is one :class:`ArrivalInterest` (optional; groupdispatch).

    Who uses it: the broker's arrival listeners (long polling, POP, schedule, timer) register what
    they wait on in :meth:`arrival_interest` and pass that object as their ``interested`` to
    :meth:`MessageStore.add_arrival_listener`; the store recognises it and asks the map once per
    put instead of calling each listener's filter.  The ``mmap`` store offers it; without it each
    listener keeps an :class:`ArrivalInterest` of its own, asked as a callable, as before.
    """

    def arrival_interest(self) -> ArrivalInterest:
        """The store's one map of waited-on queues (the same object on every call)."""


#: Per store class: whether it implements :class:`ArrivalInterests`.
_INTERESTS: dict[type, bool] = {}


def arrival_interest(store: object) -> ArrivalInterest | None:
    """``store``'s :class:`ArrivalInterest`, or None when its class does not offer one."""
    cls = type(store)
    capable = _INTERESTS.get(cls)
    if capable is None:
        capable = _INTERESTS[cls] = callable(getattr(cls, "arrival_interest", None))
    return cast(ArrivalInterests, store).arrival_interest() if capable else None


def listen_to_topic(
    store: MessageStore,
    listener: Callable[[str, int, int], None],
    topic: str,
    interested: Callable[[str, int], bool],
) -> None:
    """Register ``listener`` for the arrivals in every queue of ``topic``: in the store's one map
    when it has one (:func:`arrival_interest`), else with ``interested`` as its filter (the
    schedule's and the timer's queues)."""
    shared = arrival_interest(store)
    if shared is None:
        store.add_arrival_listener(listener, interested)
    else:
        shared.watch_topic(topic)
        store.add_arrival_listener(listener, shared)


class ArrivalNotifier:
    """Runs arrival listeners on a thread of the store's own, coalesced per queue.

    The writer notes ``(topic, queue id) -> readable max offset`` with :meth:`arrived` while it
    holds the store's lock, and this thread calls the listeners in rounds: under load many puts
    share one wake-up instead of one GIL hand-off each.  Shared by the store plugins so held pulls
    wake the same way whichever store is configured.  :attr:`interest` is the store's one map of
    waited-on queues (:class:`ArrivalInterest`).
    """

    def __init__(self, lock: threading.Lock, name: str = "store-dispatch") -> None:
        self.listeners: list[Callable[[str, int, int], None]] = []
        #: The map listeners registered with it as their ``interested`` keep up to date.
        self.interest = ArrivalInterest()
        # The other listeners' filters, asked when the map does not cover an arrival.
        self._interest: list[Callable[[str, int], bool]] = []
        # Some listener cares about every queue: every arrival is noted.
        self._every = False
        # The store's lock: writers call arrived() with it held, so the swap below takes it too
        # (no second lock on the put path).
        self._lock = lock
        self._name = name
        self._arrivals: dict[tuple[str, int], int] = {}
        self._event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_listener(
        self,
        listener: Callable[[str, int, int], None],
        interested: Callable[[str, int], bool] | None = None,
    ) -> None:
        """Call ``listener`` after arrivals; with ``interested``, only for queues it answers True for.

        ``interested`` is :attr:`interest` (a listener that registers what it waits on there: no
        call per arrival), or a callable ``interested(topic, queue_id)`` run in the writer (the
        store's lock held), so it must be cheap and must not block: a dict lookup.  The listener
        has to cope with a queue it became interested in just after an arrival (the broker's long
        polling re-reads the max offset once it has registered a held pull), and with arrivals
        another listener was interested in (it is called for every arrival noted).
        """
        self.listeners.append(listener)
        if interested is None:
            self._every = True
        elif interested is not self.interest:
            self._interest.append(interested)

    def waited(self) -> Mapping[str, Waited] | None:
        """The map a writer may look an arrival up in instead of calling :meth:`arrived` (only a
        topic/queue it finds, see :meth:`ArrivalInterest.wants`, goes to :meth:`note`), or None
        when only :meth:`arrived` decides (a listener of every queue, or a callable filter)."""
        if self._every or self._interest:
            return None
        return self.interest.waited

    def arrived(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Note that ``topic``/``queue_id`` is readable up to ``max_offset`` (the store's lock held).

        Wakes the thread only when it has nothing pending: under load many puts share one wake-up.
        An arrival no listener is interested in is dropped here: a producer writing to queues no
        pull waits on costs no wake-up of this thread at all (a profile of batched produce put 11 %
        of the broker's CPU in these rounds, mostly thread switches).
        """
        if not self._every:
            w = self.interest.waited.get(topic)
            if w is None or (w is not True and queue_id not in w):
                for wants in self._interest:
                    if wants(topic, queue_id):
                        break
                else:
                    return
        if not self._arrivals:
            self._event.set()
        self._arrivals[(topic, queue_id)] = max_offset

    def note(self, topic: str, queue_id: int, max_offset: int) -> None:
        """:meth:`arrived` for an arrival some listener is known to want (the store's lock held)."""
        if not self._arrivals:
            self._event.set()
        self._arrivals[(topic, queue_id)] = max_offset

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        """Deliver what is pending, then end the thread."""
        self._stop.set()
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _run(self) -> None:
        """Rounds start at most every ARRIVAL_ROUND_S (RocketMQ's reput service also sleeps 1 ms a
        round): a long-polling pull waits at most that much longer, and a busy store wakes this
        thread a thousand times a second at most rather than once per put.
        """
        name_this_thread()
        last_round = 0.0
        while True:
            self._event.wait()
            pause = last_round + ARRIVAL_ROUND_S - time.monotonic()
            if pause > 0 and not self._stop.is_set():
                time.sleep(pause)
            with self._lock:
                arrived, self._arrivals = self._arrivals, {}
                self._event.clear()
            for (topic, qid), max_offset in arrived.items():
                for listener in self.listeners:
                    try:
                        listener(topic, qid, max_offset)
                    except Exception:
                        log.exception("arrival listener %r failed", listener)
            last_round = time.monotonic()
            if self._stop.is_set():
                return
