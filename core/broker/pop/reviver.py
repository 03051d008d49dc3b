"""The revive task: expired checkpoints' messages back for redelivery, revive-log snapshots, and
the role the broker plays (a new master rebuilds its POP state from the replicated revive log).

It sleeps until the earliest deadline (or one second).  For each expired checkpoint it writes every
unacknowledged message to ``%RETRY%<group>_<topic>`` (past ``retryMaxTimes``: ``%DLQ%<group>``;
:mod:`tidemq.broker.pop.revive`), all puts in flight together, then retires the checkpoint.  A
crash between the two writes delivers those messages twice, never zero times.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.broker.pop.checkpoints import CheckpointTable
from tidemq.broker.pop.handle import DLQ_PREFIX, ORDER_REVIVE_QUEUE, dlq_topic
from tidemq.broker.pop.journal import Checkpoint
from tidemq.broker.pop.polling import PopWaiters
from tidemq.broker.pop.results import REVIVE_BATCH, SYNC_INTERVAL_S, now_ms
from tidemq.broker.pop.revive import dead_letters, revived_messages
from tidemq.futures import resolved
from tidemq.message import MessageInner
from tidemq.tasks import phase_of, until_tick, wait_event_for

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: A promoted slave waits this long at most for its store to index the records it copied last.
CATCH_UP_S = 10.0


class Reviver:
    def __init__(
        self,
        broker: BrokerContext,
        table: CheckpointTable,
        waiters: PopWaiters,
        rebuild: Callable[[], None],
        drop: Callable[[], None],
    ) -> None:
        self.broker = broker
        self.table = table
        self.waiters = waiters
        self._rebuild = rebuild  # the state from the revive log (this broker became master)
        self._drop = drop  # forget it (this broker is a slave now)
        self.wake = asyncio.Event()
        self.serving = False  # the state in memory is this master's
        self.revived = 0
        self.dead_lettered = 0
        self.revive_lag_ms = 0  # how late the last revive ran past its deadline

    async def run(self) -> None:
        # The one-second look ticks on the grid at its own phase (tidemq.tasks.until_tick), not in
        # step with the broker's other one-second loops; a checkpoint's deadline is kept to the ms.
        phase = phase_of("tidemq-pop-revive")
        while True:
            self.wake.clear()
            await self.follow_role()
            if self.serving:
                self.table.log.confirm_snapshot()
                await self.revive_due()
            wait = until_tick(SYNC_INTERVAL_S, phase)
            heap = self.table.heap
            if self.serving and heap:
                wait = min(wait, max(heap[0][0] - now_ms(), 0) / 1000)
            # A timer sets the event when the wait runs out: no wait_for task, no timeout raised.
            await wait_event_for(self.wake, wait)

    async def follow_role(self) -> None:
        """Take over (rebuild from the revive log) on becoming master; let go on becoming slave."""
        master = self.broker.is_master
        if master and not self.serving:
            deadline = time.monotonic() + CATCH_UP_S
            while not self.table.log.caught_up() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            self._rebuild()
            self.serving = True
            log.info("pop: serving as master: %d open checkpoints from the revive log", len(self.table.cks))
        elif not master and self.serving:
            self.serving = False
            self._drop()
            log.info("pop: this broker is a slave now; POP state left to the master")

    async def revive_due(self) -> None:
        table = self.table
        heap = table.heap
        while True:
            now = now_ms()
            due: list[Checkpoint] = []
            while heap and heap[0][0] <= now and len(due) < REVIVE_BATCH:
                _, ck_id = heapq.heappop(heap)
                ck = table.cks.get(ck_id)
                if ck is None or ck.done or any(c is ck for c in due):  # acked, revived, or twice here
                    continue
                if ck.revive_qid == ORDER_REVIVE_QUEUE:
                    self.waiters.notify(ck.topic)  # expired: its queue's next pop re-delivers
                    continue
                due.append(ck)
            if not due:
                break
            await self.revive_many(due)
            if not self.broker.is_master or not (heap and heap[0][0] <= now_ms()):
                break
        if table.log.snapshot_due():
            self.snapshot()

    def snapshot(self) -> bool:
        """Write the live state to the revive log; replay starts there from now on.  False when the
        store refused it (retried at the next revive round)."""
        before = self.table.log.size
        try:
            self.table.log.snapshot(self.table.live_records(), self.table.next_id - 1)
        except OSError as exc:
            log.error("pop: revive-log snapshot failed (retried later): %s", exc)
            return False
        log.info("pop revive log: snapshot of %d checkpoints after %d bytes", len(self.table.cks), before)
        return True

    async def revive_many(self, cks: list[Checkpoint]) -> None:
        """Write the unacknowledged messages of expired checkpoints back (all puts in flight
        together), then retire each checkpoint whose messages were all stored."""
        b = self.broker
        table = self.table
        planned: list[tuple[Checkpoint, list[tuple[MessageInner, Any]]]] = []
        for ck in cks:
            try:
                msgs = revived_messages(b, ck)
            except Exception:
                log.exception("pop: revive of checkpoint %d failed; retrying in 1 s", ck.id)
                heapq.heappush(table.heap, (now_ms() + 1000, ck.id))
                continue
            planned.append((ck, [(m, b.store.put_message(m)) for m in msgs]))
        for ck, puts in planned:
            results = await asyncio.gather(*(resolved(f) for _, f in puts), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException) or not r.ok]
            if failed or table.cks.get(ck.id) is not ck:
                if failed:
                    # Retried whole: the ones stored now are delivered twice, none is lost.
                    log.warning(
                        "pop: revive of checkpoint %d: %d messages not stored (%s); retrying in 1 s",
                        ck.id,
                        len(failed),
                        failed[0],
                    )
                    heapq.heappush(table.heap, (now_ms() + 1000, ck.id))
                continue
            for (m, _), r in zip(puts, results, strict=True):
                assert not isinstance(r, BaseException)
                b.stats.on_put(m.topic, 1, r.wrote_bytes)
                if m.topic.startswith(DLQ_PREFIX):
                    self.dead_lettered += 1
                else:
                    self.revived += 1
            self.revive_lag_ms = max(now_ms() - ck.deadline, 0)
            problem = await b.topics.written(*{m.topic for m, _ in puts}) if b.topics.unwritten else None
            if problem is not None:  # a retry or dead-letter topic it created is not on disk yet
                log.warning("pop: checkpoint %d revived again in 1 s: %s", ck.id, problem)
                heapq.heappush(table.heap, (now_ms() + 1000, ck.id))
                continue
            try:
                table.retire(ck)
            except OSError as exc:
                log.error(
                    "pop: checkpoint %d revived, its retirement not written (%s): revived again", ck.id, exc
                )
                heapq.heappush(table.heap, (now_ms() + 1000, ck.id))

    async def dead_letter(self, group: str, topic: str, qid: int, offsets: list[int]) -> None:
        for msg in dead_letters(self.broker, group, topic, qid, offsets):
            put = await resolved(self.broker.store.put_message(msg))
            if put.ok:
                self.dead_lettered += 1
        # %DLQ%<group>, when created here, is on disk before the caller retires the checkpoints.
        problem = await self.broker.topics.written(dlq_topic(group)) if self.broker.topics.unwritten else None
        if problem is not None:
            log.error("pop: %s", problem)
