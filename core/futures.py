"""Awaiting the store's futures from an event loop.

The store resolves its :class:`concurrent.futures.Future` on whichever thread made the data
durable (the group-commit thread under sync flush), usually many at once.
``asyncio.wrap_future`` wakes the loop once per future (a write to the loop's self-pipe, a
callback hop and two chained futures each); :func:`resolved` queues results per loop and wakes it
once per burst, so a flush that acknowledges 32 writers costs one wake-up, not 32.

A group of futures resolved together (the puts of one loop iteration, made durable by one
group-commit round) can share a :class:`SharedCompletion`: the tasks awaiting any of them wait on
one asyncio future per group, set once, and the resolving thread settles the futures in bulk
(:func:`resolve_all`): no asyncio future, callback or hop per put.  Code that needs no task at all
(the broker's send lane answering a whole round's sends in one pass) registers a callback on the
group instead (:meth:`SharedCompletion.call_when_done`): it runs on the loop, in the same burst.
A round flushed on the loop itself completes its groups there (:func:`complete_here`): no hop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from _thread import LockType
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class _LoopWaker:
    """Delivers results of futures resolved on other threads into one event loop, in batches."""

    __slots__ = ("__weakref__", "_armed", "_calls", "_lock", "_loop", "_ready")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], Future[Any] | None]] = []  # None: a shared completion
        #: Shared completions' callbacks, ``(fn, arg)``: run after the results of the same burst.
        self._calls: list[tuple[Callable[[Any], Any], Any]] = []
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
        self._kick()

    def wake(
        self, waiter: asyncio.Future[Any] | None, calls: list[tuple[Callable[[Any], Any], Any]] | None = None
    ) -> None:
        """Runs on any thread: set ``waiter`` (a shared completion's) and run ``calls`` with the
        next burst (one hop into the loop for all that a burst brings)."""
        with self._lock:
            if waiter is not None:
                self._ready.append((waiter, None))
            if calls:
                self._calls += calls
            if self._armed:
                return
            self._armed = True
        self._kick()

    def wake_many(
        self, waiters: list[asyncio.Future[Any]], calls: list[tuple[Callable[[Any], Any], Any]]
    ) -> None:
        """:meth:`wake` for several shared completions at once (one hop into the loop)."""
        with self._lock:
            self._ready += [(waiter, None) for waiter in waiters]
            self._calls += calls
            if self._armed:
                return
            self._armed = True
        self._kick()

    def _kick(self) -> None:
        """One hop into the loop for what is queued (the caller armed it, under the lock)."""
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            calls, self._calls = self._calls, []
            self._armed = False
        for fn, arg in calls:
            try:
                fn(arg)
            except Exception:
                log.exception("a shared completion's callback failed")
        for waiter, future in ready:
            if waiter.done():  # the awaiting task was cancelled
                continue
            if future is None:  # a shared completion
                waiter.set_result(None)
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


def _waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    return waker


async def resolved(future: Future[T]) -> T:
    """The result of a concurrent future: at once when it is done (the usual case), else awaited.

    A :class:`StoreFuture` that belongs to a :class:`SharedCompletion` of the running loop is
    awaited through the group's one asyncio future (no future or callback of its own).
    """
    if future.done():
        return future.result()
    loop = asyncio.get_running_loop()
    completion = getattr(future, "completion", None)
    if completion is not None and completion.loop is loop:
        await completion.wait()
        if future.done():  # always, unless the future was resolved apart from its group
            return future.result()
    return await _waker(loop).bridge(future)


class SharedCompletion:
    """One wait for a group of futures resolved together, by tasks of one event loop.

    The resolving thread settles the group's futures first (:func:`resolve_all`), then calls
    :meth:`complete`: one asyncio future, made by the first task that waits, is set with one hop
    into the loop (coalesced with other results of the same burst).  A task cancelled while
    waiting cancels that shared future; the others see it and wait on a fresh one.  Callbacks
    (:meth:`call_when_done`) run on the loop in that same hop, before the waiting tasks resume.
    """

    __slots__ = ("_calls", "_done", "_waiter", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._done = False
        self._waiter: asyncio.Future[None] | None = None
        self._calls: list[tuple[Callable[[Any], Any], Any]] | None = None

    def call_when_done(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """On :attr:`loop`: call ``fn(arg)`` on the loop once the group is complete, with the
        hop that wakes its tasks (no task, future or hop of its own); soon when it is already."""
        with _STATE_LOCK:
            if not self._done:
                if self._calls is None:
                    self._calls = [(fn, arg)]
                else:
                    self._calls.append((fn, arg))
                return
        self.loop.call_soon(fn, arg)

    @property
    def done(self) -> bool:
        return self._done

    async def wait(self) -> None:
        """On :attr:`loop`: until :meth:`complete` (returns at once when it has been called)."""
        while True:
            waiter = self._waiter
            if waiter is None:
                with _STATE_LOCK:
                    if self._done:
                        return
                    waiter = self._waiter = self.loop.create_future()
            # The future is shared: a coroutine driven outside a Task (the transport runs a
            # request eagerly up to its first wait) leaves it marked "blocking" until its driver
            # takes it, and a second coroutine awaiting it meanwhile would be refused ("await
            # wasn't used with future").  Every driver unmarks what it was given, as a Task does.
            waiter._asyncio_future_blocking = False
            try:
                await waiter
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this task was cancelled
                # Another waiter's cancellation cancelled the shared future: wait on a fresh one.
                with _STATE_LOCK:
                    if self._waiter is waiter:
                        self._waiter = None

    def complete(self) -> None:
        """Any thread, once the group's futures are resolved: wake the tasks waiting for them."""
        with _STATE_LOCK:
            if self._done:
                return
            self._done = True
            waiter = self._waiter
            calls, self._calls = self._calls, None
        if waiter is not None or calls:
            _waker(self.loop).wake(waiter, calls)


def complete_all(completions: list[SharedCompletion]) -> None:
    """:meth:`SharedCompletion.complete` for each (a flush round's groups), with one hop into each
    loop for all of them: a round wakes its loop exactly once, however many groups it made durable."""
    posts: dict[asyncio.AbstractEventLoop, tuple[list[asyncio.Future[Any]], list[Any]]] = {}
    with _STATE_LOCK:
        for completion in completions:
            if completion._done:
                continue
            completion._done = True
            waiter, calls = completion._waiter, completion._calls
            completion._calls = None
            if waiter is None and not calls:
                continue
            post = posts.get(completion.loop)
            if post is None:
                post = posts[completion.loop] = ([], [])
            if waiter is not None:
                post[0].append(waiter)
            if calls:
                post[1].extend(calls)
    for loop, (waiters, calls) in posts.items():
        _waker(loop).wake_many(waiters, calls)


def complete_here(completions: list[SharedCompletion], loop: asyncio.AbstractEventLoop) -> None:
    """:func:`complete_all` called on ``loop`` (a round flushed inline): the groups of ``loop``
    complete now, their callbacks run before this returns and their waiting tasks are woken
    with :meth:`asyncio.Future.set_result` (no hop, no write to the loop's self-pipe); groups
    of other loops as :func:`complete_all`."""
    others: list[SharedCompletion] = []
    mine: list[tuple[asyncio.Future[None] | None, list[tuple[Callable[[Any], Any], Any]] | None]] = []
    with _STATE_LOCK:
        for completion in completions:
            if completion.loop is not loop:
                others.append(completion)
                continue
            if completion._done:
                continue
            completion._done = True
            mine.append((completion._waiter, completion._calls))
            completion._calls = None
    for _waiter, calls in mine:
        for fn, arg in calls or ():
            try:
                fn(arg)
            except Exception:
                log.exception("a shared completion's callback failed")
    for waiter, _calls in mine:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
    if others:
        complete_all(others)


def resolve_all(futures: list[Future[Any]], values: list[Any]) -> None:
    """Resolve ``futures[i]`` with ``values[i]``, skipping those already resolved (a timeout got
    there first): :class:`StoreFuture` s under one lock, their callbacks (rare) after it."""
    late: list[tuple[StoreFuture[Any], list[Any] | None, LockType | None]] = []
    plain: list[tuple[Future[Any], Any]] = []
    with _STATE_LOCK:
        for fut, value in zip(futures, values, strict=True):
            if type(fut) is StoreFuture:
                if fut._sf_state != 0:
                    continue
                fut._sf_result, fut._sf_state = value, 1
                if fut._sf_callbacks is not None or fut._sf_gate is not None:
                    late.append((fut, fut._sf_callbacks, fut._sf_gate))
                    fut._sf_callbacks = None
            else:
                plain.append((fut, value))
    for fut, callbacks, gate in late:
        fut._notify(callbacks, gate)
    for fut, value in plain:
        try:
            fut.set_result(value)
        except InvalidStateError:
            pass


# --------------------------------------------------------------------------- light futures
_STATE_LOCK = threading.Lock()  # one for all: taken only to add a callback or to resolve


class StoreFuture(Future[T]):
    """A :class:`concurrent.futures.Future` without a ``threading.Condition`` of its own.

    The store hands one out per put, so the Condition (and the RLock inside it) that a plain Future
    builds in ``__init__`` was a measurable share of a send.  This one keeps its state in slots,
    takes one module-wide lock only to add a callback or to resolve, and makes a *gate* only when a
    thread really blocks in :meth:`result` before it is done (writer threads, tests; never the
    broker's event loop): one bare lock, held until the future is resolved, that the waiting threads
    acquire and pass on (a ``threading.Event`` is a Condition, a lock and Python code on both sides:
    ~10 µs of CPU per put for 32 sync-flush writer threads).  It is still a ``Future``:
    ``asyncio.wrap_future`` and :func:`resolved` accept it.
    """

    __slots__ = ("_sf_callbacks", "_sf_exc", "_sf_gate", "_sf_result", "_sf_state", "completion")

    def __init__(self) -> None:  # no super().__init__(): that builds the Condition
        self._sf_state = 0  # 0 pending, 1 done, 2 cancelled
        self._sf_result: Any = None
        self._sf_exc: BaseException | None = None
        self._sf_callbacks: list[Any] | None = None
        self._sf_gate: LockType | None = None  # held while pending, once a thread waits
        #: The group this future is resolved with (set by whoever resolves it, e.g. group commit):
        #: :func:`resolved` then waits on the group's one asyncio future instead of its own.
        self.completion: SharedCompletion | None = None

    @classmethod
    def completed(cls, value: T) -> StoreFuture[T]:
        fut: StoreFuture[T] = cls()
        fut._sf_result = value
        fut._sf_state = 1
        return fut

    def __repr__(self) -> str:
        return f"<StoreFuture {('pending', 'finished', 'cancelled')[self._sf_state]}>"

    def done(self) -> bool:
        return self._sf_state != 0

    def cancelled(self) -> bool:
        return self._sf_state == 2

    def running(self) -> bool:
        return False

    def cancel(self) -> bool:
        return self._resolve(2, None, None)

    def set_running_or_notify_cancel(self) -> bool:
        return self._sf_state != 2

    def set_result(self, result: T) -> None:
        if not self._resolve(1, result, None):
            from concurrent.futures import InvalidStateError

            raise InvalidStateError(f"{self!r} is already resolved")

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._resolve(1, None, exception):
            from concurrent.futures import InvalidStateError

            raise InvalidStateError(f"{self!r} is already resolved")

    def _resolve(self, state: int, result: Any, exc: BaseException | None) -> bool:
        with _STATE_LOCK:
            if self._sf_state != 0:
                return False
            self._sf_result, self._sf_exc, self._sf_state = result, exc, state
            callbacks, self._sf_callbacks = self._sf_callbacks, None
            gate = self._sf_gate
        if gate is not None or callbacks:
            self._notify(callbacks, gate)
        return True

    def _notify(self, callbacks: list[Any] | None, gate: LockType | None) -> None:
        """After resolving (taken under the lock): open the gate of the threads blocked in
        :meth:`result`, run the callbacks."""
        if gate is not None:
            gate.release()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                import logging

                logging.getLogger(__name__).exception("a future's callback failed")

    def add_done_callback(self, fn: Any) -> None:
        if self._sf_state == 0:
            with _STATE_LOCK:
                if self._sf_state == 0:
                    if self._sf_callbacks is None:
                        self._sf_callbacks = []
                    self._sf_callbacks.append(fn)
                    return
        fn(self)

    def _wait(self, timeout: float | None) -> None:
        if self._sf_state != 0:
            return
        with _STATE_LOCK:
            if self._sf_state != 0:
                return
            gate = self._sf_gate
            if gate is None:
                gate = self._sf_gate = threading.Lock()
                gate.acquire()  # released once, by whoever resolves the future
        if timeout is None:
            gate.acquire()
        elif not gate.acquire(timeout > 0, timeout if timeout > 0 else -1):
            from concurrent.futures import TimeoutError as FutureTimeout

            raise FutureTimeout()
        gate.release()  # open for the next thread waiting on it

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._sf_state == 2:
            from concurrent.futures import CancelledError

            raise CancelledError()
        if self._sf_exc is not None:
            raise self._sf_exc
        return self._sf_result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        if self._sf_state == 2:
            from concurrent.futures import CancelledError

            raise CancelledError()
        return self._sf_exc
