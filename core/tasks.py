"""Supervised background tasks: a loop that fails is logged and started again, never silently gone.

A plain ``asyncio.create_task(loop())`` whose loop raises ends quietly (the exception surfaces, if
ever, when the task is garbage-collected), and the service it provided (broker expiry, offset
flushes, registration...) stops with no sign.  :func:`supervise` runs the loop, logs any failure
with the task's name and a traceback, and starts it again after a growing pause.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: First pause before a failed task runs again; doubled on each failure up to RESTART_MAX_S.
RESTART_MIN_S = 0.5
RESTART_MAX_S = 30.0


def supervise(factory: Callable[[], Awaitable[None]], name: str) -> asyncio.Task[None]:
    """Run ``factory()`` as the task ``name``; whenever it raises or returns, log it and run it again.

    Cancelling the returned task stops the loop (the cancellation reaches the running ``factory()``).
    """
    return asyncio.get_running_loop().create_task(_supervisor(factory, name), name=name)


async def _supervisor(factory: Callable[[], Awaitable[None]], name: str) -> None:
    loop = asyncio.get_running_loop()
    delay = RESTART_MIN_S
    while True:
        started = loop.time()
        try:
            await factory()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %s failed; restarting it in %.2f s", name, delay)
        else:
            log.error("background task %s returned; restarting it in %.2f s", name, delay)
        # A task that ran a good while before failing starts the backoff afresh.
        if loop.time() - started > RESTART_MAX_S:
            delay = RESTART_MIN_S
        await asyncio.sleep(delay)
        delay = min(delay * 2, RESTART_MAX_S)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """``event.wait()`` for at most ``timeout`` seconds; True when the event was set.

    CPython 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives while the event is
    being set (it returns the result instead of raising), so a loop waiting that way outlives its
    ``cancel()`` and a ``stop()`` gathering it never returns.  ``asyncio.timeout`` tells the two
    apart: the cancellation always wins.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


#: How close before a tick a wake-up counts as that tick's (see :func:`until_tick`).
TICK_SLACK_S = 0.002


def phase_of(name: str) -> float:
    """A fraction in [0, 1) fixed by ``name``: where in its period a periodic loop of that name ticks."""
    return (zlib.crc32(name.encode()) & 0xFFFF) / 0x10000


def until_tick(period: float, phase: float, now: float | None = None) -> float:
    """Seconds from ``now`` (the running loop's clock) to the loop's next tick: the next instant
    ``phase * period + k * period`` at least ``TICK_SLACK_S`` away (or a quarter period when shorter).

    Periodic loops that sleep a whole period after each pass all tick at the instant they were
    started, and a broker starts them together: their passes then run back to back, every period,
    as one stretch of the event loop that holds up every request arriving meanwhile (issue 38:
    eighteen delay levels and the timer's enqueue every 0.5 s, ~400 µs of loop CPU at once).
    Ticks on a grid at different phases keep them apart, and stay apart (no drift: a pass that
    runs late does not move the next tick).
    """
    if now is None:
        now = asyncio.get_running_loop().time()
    left = period - (now - phase * period) % period
    # A timer may fire a little before its time (uvloop's have a millisecond's grain): a wake-up
    # that close to a tick is that tick's, and the next wait is for the one after, not a few
    # hundred microseconds (which would wake the loop again and again until the clock passed it).
    if left < min(TICK_SLACK_S, period / 4):
        left += period
    return left


async def sleep_until_tick(period: float, phase: float) -> None:
    """``asyncio.sleep`` to the next tick of :func:`until_tick`."""
    await asyncio.sleep(until_tick(period, phase))


async def wait_event_until_tick(event: asyncio.Event, period: float, phase: float) -> None:
    """Wait for ``event`` at most until the next tick of :func:`until_tick`, when a timer sets it:
    either way the event is set on return (the caller clears it before its next pass).

    For a loop that looks again when woken or when its period comes round.  Unlike
    :func:`wait_event`, no timeout exception is raised and caught when the wait runs out (a timed
    out ``asyncio.timeout`` costs a cancellation, two exceptions and a reference cycle the cyclic
    GC has to free): one timer handle, cancelled when the event came first.
    """
    await wait_event_for(event, until_tick(period, phase))


async def wait_event_for(event: asyncio.Event, delay: float) -> None:
    """Wait for ``event`` at most ``delay`` seconds, when a timer sets it: either way the event is
    set on return.  :func:`wait_event` without the timeout's exceptions (see
    :func:`wait_event_until_tick`), for a wait whose length is not a tick's (a deadline)."""
    if event.is_set():
        return
    timer = asyncio.get_running_loop().call_later(max(delay, 0.0), event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()
