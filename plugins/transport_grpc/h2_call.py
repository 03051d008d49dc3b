"""One gRPC call of the native server (:mod:`.h2_connection`): its stream's state (a call
started outside a Task goes on as one through :func:`tidemq.resume_eager`)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from .h2_context import CallContext


class Call:
    """One stream: its request messages as they arrive, its handler's task, its writer's state."""

    __slots__ = (
        "stream_id",
        "handler",
        "context",
        "buffer",
        "messages",
        "ended",
        "task",
        "headers_sent",
        "closed",
        "waiter",
        "unacked",
        "compressed",
        "deadline_timer",
    )

    def __init__(self, stream_id: int, handler: Any, context: CallContext, compressed: bool) -> None:
        self.stream_id = stream_id
        self.handler = handler
        self.context = context
        self.buffer = bytearray()
        #: Parsed request messages not yet read by the handler, with their wire size.
        self.messages: deque[tuple[bytes, int]] = deque()
        self.ended = False
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.closed = False
        #: A future the handler's reader (or writer) waits on.
        self.waiter: asyncio.Future[None] | None = None
        #: Request bytes received but not yet returned to the client's window.
        self.unacked = 0
        self.compressed = compressed
        self.deadline_timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Deserialize(Exception):
    pass


class NoRequest(Exception):
    pass
