"""Supervised background tasks: a loop that fails is logged and started again, never silently gone.

A plain ``asyncio.create_task(loop())`` whose loop raises ends quietly (the exception surfaces, if
ever, when the task is garbage-collected), and the service it provided (broker expiry, offset
flushes, registration...) stops with no sign.  :func:`supervise` runs the loop, logs any failure
with the task's name and a traceback, and starts it again after a growing pause.
"""

from __future__ import annotations

import asyncio
import logging
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
