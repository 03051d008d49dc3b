"""The messages of one assigned queue between pull and consume (RocketMQ's ProcessQueue).

It tracks what was pulled but not yet consumed, so flow control can pause pulling and the
committed offset never passes the lowest unfinished message.
"""

from __future__ import annotations

import asyncio
import time

from tidemq.message import MessageExt

#: A queue lock taken on the broker is trusted for this long without renewal (broker keeps 60 s).
LOCK_TRUST_S = 30.0


class ProcessQueue:
    """Pulled messages of one queue, keyed by queue offset."""

    def __init__(self) -> None:
        self.msgs: dict[int, MessageExt] = {}
        self.msg_size = 0
        self.max_offset = -1  # highest queue offset ever put
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.last_pull_time = 0.0
        self.last_consume_time = 0.0  # monotonic; shown to operators (ProcessQueueInfo)
        # orderly: messages handed to the listener but not committed yet
        self.consuming: dict[int, MessageExt] = {}
        self.wakeup = asyncio.Event()
        #: orderly: held while a batch is in the listener, so a rebalance unlocks only between batches
        self.consume_lock = asyncio.Lock()

    @property
    def msg_count(self) -> int:
        return len(self.msgs) + len(self.consuming)

    def put(self, messages: list[MessageExt]) -> None:
        for m in messages:
            if m.queue_offset not in self.msgs:
                self.msgs[m.queue_offset] = m
                self.msg_size += len(m.body)
            self.max_offset = max(self.max_offset, m.queue_offset)
        if messages:
            self.wakeup.set()

    def remove(self, messages: list[MessageExt]) -> int:
        """Forget consumed messages; the offset safe to commit (lowest unfinished, else max + 1)."""
        self.last_consume_time = time.monotonic()
        for m in messages:
            if self.msgs.pop(m.queue_offset, None) is not None:
                self.msg_size -= len(m.body)
        return self.commit_point()

    def commit_point(self) -> int:
        pending = [*self.msgs, *self.consuming]
        return min(pending) if pending else self.max_offset + 1

    def lock_expired(self) -> bool:
        return time.monotonic() - self.last_lock_time > LOCK_TRUST_S

    # ------------------------------------------------------------------ orderly
    def take(self, n: int) -> list[MessageExt]:
        """The next ``n`` messages in offset order, moved to the consuming set."""
        out = []
        for off in sorted(self.msgs)[:n]:
            m = self.msgs.pop(off)
            self.consuming[off] = m
            out.append(m)
        if not self.msgs:
            self.wakeup.clear()
        return out

    def commit(self) -> int:
        """The batch in the consuming set is done; the offset to commit."""
        self.last_consume_time = time.monotonic()
        for m in self.consuming.values():
            self.msg_size -= len(m.body)
        self.consuming.clear()
        return self.commit_point()

    def rollback(self) -> None:
        """Put the consuming batch back to be consumed again, in order."""
        self.msgs.update(self.consuming)
        self.consuming.clear()
        if self.msgs:
            self.wakeup.set()
