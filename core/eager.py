"""Handlers run eagerly: a coroutine started by hand (``coro.send(None)``) inside a protocol
callback, and finished as a Task only if it really waits.

Most requests (a send under async flush, a pull that finds messages, a v5 ack) finish without a
real wait; running their coroutine right there skips a Task and a loop turn.  One that waits is
handed to :func:`resume_eager` in a new Task, which finishes it as a Task would have.  Both transports
(remoting over TCP, the native gRPC server) use it.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def resume_eager(coro: Any, yielded: Any) -> None:
    """Finish a coroutine started outside a Task: wait for what it yielded, step it, repeat; a
    cancel of the Task running this reaches the coroutine.

    ``await fut`` in the coroutine yields ``fut`` and, once resumed, reads ``fut.result()``
    itself, so a failed or cancelled future reaches it as its own exception.
    """
    while True:
        throw: BaseException | None = None
        try:
            if yielded is None:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False  # as a Task does, before awaiting it again
                await yielded
        except asyncio.CancelledError:
            if yielded is None or not yielded.cancelled():  # this Task was cancelled
                throw = asyncio.CancelledError()
        except BaseException:
            pass  # the coroutine sees the future's exception when it reads the result
        try:
            yielded = coro.send(None) if throw is None else coro.throw(throw)
        except StopIteration:
            return
