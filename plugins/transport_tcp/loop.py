"""Event loop helpers: uvloop when it is installed, asyncio's loop otherwise.

Whoever runs the loop (the CLI, a test, an embedding application) picks it; the transport works
on either.  ``TIDEMQ_UVLOOP=0`` forces the stdlib loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_available() -> bool:
    if os.environ.get("TIDEMQ_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when available."""
    if uvloop_available():
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run`` on :func:`new_event_loop`."""
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(coro)
