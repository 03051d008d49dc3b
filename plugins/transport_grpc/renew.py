"""``auto_renew``: the messages a PushConsumer received, kept invisible while it consumes them.

A PushConsumer receives with ``auto_renew`` and no invisible time; RocketMQ's proxy
(ReceiptHandleProcessor) then keeps each message invisible in slices, renewing it shortly before
its slice ends, until the client settles it (ack, change of invisibility, forward to the DLQ), goes
away (the message is made visible a second later) or holds it too long.  Each renewal spends the
handle and makes a new one, so the client's settle is done with the newest handle kept here.
"""

from __future__ import annotations

import asyncio
import logging
import time

import attrs

from .consume_types import ConsumeBackend, ConsumeRefused

log = logging.getLogger(__name__)

#: RocketMQ's proxy defaults (ProxyConfig).
SLICE_MS = 60_000  # defaultInvisibleTimeMills: each renewal's invisibility
AHEAD_MS = 10_000  # renewAheadTimeMillis: renew when less than this is left
PERIOD_S = 5.0  # renewSchedulePeriodMillis
MAX_HOLD_MS = 3 * 3600 * 1000  # a message held longer is left to expire (and be redelivered)
CLEAR_INVISIBLE_MS = 1_000  # invisibleTimeMillisWhenClear: a gone client's messages come back after this
#: Messages renewed for one client at most (a PushConsumer caches 1024 by default); more are not
#: renewed: they come back after their slice, as without auto_renew.
MAX_PER_CLIENT = 10_000


@attrs.define
class _Held:
    group: str
    topic: str
    handle: str
    deadline_ms: int
    since_ms: int
    renewing: asyncio.Event | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


class Renewals:
    """The auto-renewed messages of every client, by ``(group, message id)``."""

    def __init__(
        self,
        backend: ConsumeBackend,
        slice_ms: int = SLICE_MS,
        ahead_ms: int = AHEAD_MS,
        period_s: float = PERIOD_S,
    ) -> None:
        self.backend = backend
        self.slice_ms = slice_ms
        self.ahead_ms = ahead_ms
        self.period_s = period_s
        self.held: dict[str, dict[tuple[str, str], _Held]] = {}
        self._task: asyncio.Task[None] | None = None

    def count(self) -> int:
        return sum(len(by_id) for by_id in self.held.values())

    def hold(
        self, client_id: str, group: str, topic: str, message_id: str, handle: str, invisible_ms: int
    ) -> None:
        by_id = self.held.setdefault(client_id, {})
        if len(by_id) >= MAX_PER_CLIENT:
            return
        now = _now_ms()
        by_id[(group, message_id)] = _Held(group, topic, handle, now + invisible_ms, now)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def take(self, client_id: str, group: str, message_id: str, handle: str) -> str:
        """The handle to settle the message with (the newest, when it was renewed); it is no
        longer renewed."""
        by_id = self.held.get(client_id)
        held = by_id.pop((group, message_id), None) if by_id else None
        if held is None:
            return handle
        if held.renewing is not None:
            await held.renewing.wait()
        return held.handle

    async def clear(self, client_id: str) -> None:
        """The client went away: its messages come back soon, not at the end of their slice."""
        for held in (self.held.pop(client_id, None) or {}).values():
            if held.renewing is not None:
                await held.renewing.wait()
            try:
                await self.backend.change_invisible(held.group, held.topic, held.handle, CLEAR_INVISIBLE_MS)
            except ConsumeRefused as exc:
                log.debug("a gone client's message was not made visible: %s", exc)

    async def _loop(self) -> None:
        while self.count():
            await asyncio.sleep(self.period_s)
            now = _now_ms()
            for client_id, by_id in list(self.held.items()):
                for key, held in list(by_id.items()):
                    if held.deadline_ms - now > self.ahead_ms:
                        continue
                    if now - held.since_ms > MAX_HOLD_MS or held.deadline_ms <= now:
                        by_id.pop(key, None)  # held too long, or too late: it is redelivered
                        continue
                    await self._renew(held, by_id, key)
                if not by_id:
                    self.held.pop(client_id, None)

    async def _renew(self, held: _Held, by_id: dict[tuple[str, str], _Held], key: tuple[str, str]) -> None:
        held.renewing = asyncio.Event()
        try:
            held.handle = await self.backend.change_invisible(
                held.group, held.topic, held.handle, self.slice_ms
            )
            held.deadline_ms = _now_ms() + self.slice_ms
        except ConsumeRefused as exc:
            log.debug("renewal of %s/%s stopped: %s", held.group, key[1], exc)
            by_id.pop(key, None)
        finally:
            held.renewing.set()
            held.renewing = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.held.clear()
