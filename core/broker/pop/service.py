"""The POP engine: pop, peek, notification and assignment, over its parts.

Callable with plain values (the remoting codecs in :mod:`tidemq.broker.processors.pop` and, later,
a gRPC front end sit on top).  The parts, one concept each:

* :mod:`~tidemq.broker.pop.checkpoints`: the memory, one checkpoint per pop *batch* (its acks a
  bit mask), bounded by :data:`~tidemq.broker.pop.results.MAX_CHECKPOINTS`;
* :mod:`~tidemq.broker.pop.revive_log`: where every change is written first, the commit log's
  ``rmq_sys_REVIVE_LOG_<cluster>`` topic (replicated to slaves; replayed at start and by a slave
  that becomes master);
* :mod:`~tidemq.broker.pop.acks`: ACK_MESSAGE, BATCH_ACK_MESSAGE entries, changes of invisibility;
* :mod:`~tidemq.broker.pop.reviver`: the revive task and the role the broker plays;
* :mod:`~tidemq.broker.pop.checks`, :mod:`~tidemq.broker.pop.polling`,
  :mod:`~tidemq.broker.pop.assignment`: request checks, held requests, request modes.

* A pop reads a queue from the group's pop offset, writes a checkpoint, moves the offset past the
  batch and answers; the messages are invisible until ``popTime + invisibleTime``.
* FIFO (``consumeMessageOrderly`` groups, or ``order=true`` pops): a queue with an open, unexpired
  checkpoint is skipped; once it expires, the next pop re-delivers its unacknowledged messages from
  the same queue with the attempt count (RocketMQ's ConsumerOrderInfoManager), no retry topic.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.broker.pop.acks import AckRequest, Acks
from tidemq.broker.pop.assignment import RequestModeTable, allocate_averagely
from tidemq.broker.pop.checkpoints import CheckpointTable
from tidemq.broker.pop.checks import Checks
from tidemq.broker.pop.handle import ORDER_REVIVE_QUEUE, RETRY_PREFIX, retry_topic_v1
from tidemq.broker.pop.journal import Checkpoint, Journal, Replayed
from tidemq.broker.pop.polling import PopWaiters
from tidemq.broker.pop.results import (
    INIT_MIN,
    INVALID_PARAMETER,
    MAX_CHECKPOINTS,
    MAX_POLLERS,
    MAX_POP_NUMS,
    POLLING_FULL,
    RETRY_FIRST_PERCENT,
    PopError,
    PoppedBatch,
    PopResult,
    now_ms,
)
from tidemq.broker.pop.revive_log import ReviveLog, ReviveLogError
from tidemq.broker.pop.reviver import Reviver
from tidemq.filter import EXPRESSION_TAG, MessageFilter
from tidemq.futures import resolved
from tidemq.remoting.codes import ResponseCode
from tidemq.store import GetStatus, PutResult
from tidemq.tasks import supervise

# A private generator: the process's global `random` state stays the application's.
_random = random.Random()

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)


class PopService:
    """POP consumption for one broker; :meth:`attach` before the store starts, then :meth:`start`."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        #: Each group's request mode (SET_MESSAGE_REQUEST_MODE), for QUERY_ASSIGNMENT.
        self.modes = RequestModeTable(broker.data_dir / "config" / "messageRequestMode.json")
        self.log = ReviveLog(broker)
        self.waiters = PopWaiters()
        self.table = CheckpointTable(broker, self.log, self._wake)
        self.reviver = Reviver(broker, self.table, self.waiters, self._rebuild, self._drop)
        self.checks = Checks(broker, lambda: self.reviver.serving, self._wake)
        self.acks = Acks(self.table, self.checks, self.waiters)
        self._tasks: list[asyncio.Task[None]] = []
        self._replicated = 0  # the revive log's end known to be replicated as the role requires
        # the operations of the parts, named here for the transports
        self.check_group = self.checks.check_group
        self.check_topic = self.checks.check_topic
        self.ack = self.acks.ack
        self.batch_ack = self.acks.batch_ack
        self.change_invisible = self.acks.change_invisible
        self.in_flight = self.table.in_flight
        self.in_flight_table = self.table.in_flight_table
        self.queue_progress = self.table.queue_progress

    def _wake(self) -> None:
        self.reviver.wake.set()

    # ------------------------------------------------------------------ lifecycle
    @property
    def legacy_journal(self) -> Path:
        """Where the POP state lived before the revive log (a file of its own, not replicated)."""
        return self.broker.data_dir / "pop" / "journal.log"

    def load(self) -> None:
        self.modes.load()
        if self.broker.is_master:
            self._rebuild()
            self.reviver.serving = True

    def _rebuild(self) -> None:
        """The state from the revive log (and, once, from a journal file of an older version)."""
        state = self.log.replay()
        legacy = self.legacy_journal
        if legacy.exists():
            old = Journal(legacy).read()
            state = Replayed(
                {**old.checkpoints, **state.checkpoints},
                {**old.offsets, **state.offsets},
                max(old.last_id, state.last_id),
            )
        self.table.install(state)
        if state.checkpoints:
            log.info("pop: %d open checkpoints recovered from %s", len(state.checkpoints), self.log.topic)
        if self._tasks:
            self._migrate()
        self._wake()

    def _migrate(self) -> None:
        """A journal file of an older version, read into memory at load: written to the revive log
        (the store takes writes once it started), then renamed so it is not read again."""
        legacy = self.legacy_journal
        if not legacy.exists() or not self.reviver.serving:
            return
        if not self.reviver.snapshot():
            log.error("pop: %s kept: its state could not be written to the revive log", legacy)
            return
        legacy.rename(legacy.with_suffix(".log.migrated"))
        log.info("pop: %s moved into the revive log %s", legacy, self.log.topic)

    def _drop(self) -> None:
        self.table.clear()
        self.log.forget_snapshot()
        self.waiters.release_all()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Replay the revive log and listen for arrivals (after the store loaded, before it starts)."""
        self.load()
        self.waiters.bind(loop)
        self.waiters.listen(self.broker.store)

    def start(self) -> None:
        self._tasks.append(supervise(self.reviver.run, "tidemq-pop-revive"))
        self._migrate()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.waiters.release_all()

    def settle(self) -> Awaitable[None] | None:
        """None when the revive-log records written so far are flushed and replicated as the
        broker's flush mode and role require (SYNC_FLUSH, SYNC_MASTER), else what to await first:
        answers wait for it, so an answered pop or ack is on a slave before a failover."""
        fut = self.log.pending
        if fut is None:
            return None
        if not fut.done():
            return self._settle(fut)
        result = fut.result()
        if not result.ok:
            return None
        end = result.wrote_offset + result.wrote_bytes
        if end <= self._replicated:
            return None
        replica = self.broker.replication.wait_for_replicas(end)
        if replica.done():
            self._replicated = end
            return None
        return self._replica(replica, end)

    async def _settle(self, fut: Future[PutResult]) -> None:
        result = await resolved(fut)
        if not result.ok:
            log.warning("pop: revive-log record not flushed: %s %s", result.status.name, result.error)
            return
        later = self.settle()
        if later is not None:
            await later

    async def _replica(self, replica: Future[Any], end: int) -> None:
        status = await resolved(replica)
        self._replicated = max(self._replicated, end)
        log.debug("pop: revive log replicated to %d: %s", end, status)

    async def durable(self) -> None:
        """Wait for :meth:`settle`."""
        later = self.settle()
        if later is not None:
            await later

    def ack_many(self, acks: Sequence[AckRequest]) -> list[PopError | None]:
        """The ACK_MESSAGEs of one read, with one revive-log record (:meth:`Acks.ack_many`)."""
        return self.acks.ack_many(acks)

    # the revive figures
    @property
    def revived(self) -> int:
        return self.reviver.revived

    @property
    def dead_lettered(self) -> int:
        return self.reviver.dead_lettered

    @property
    def revive_lag_ms(self) -> int:
        return self.reviver.revive_lag_ms

    # ------------------------------------------------------------------ pop
    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int = -1,
        max_nums: int = 32,
        invisible_ms: int = 30_000,
        poll_ms: int = 0,
        init_mode: int = INIT_MIN,
        expression_type: str = EXPRESSION_TAG,
        expression: str = "*",
        order: bool = False,
        closed: Any = None,
    ) -> PopResult:
        """Pop up to ``max_nums`` messages; waits up to ``poll_ms`` for one.  Raises :class:`PopError`.

        ``closed()``, when given, ends a wait early (the client's connection went away).
        """
        b = self.broker
        if not 1 <= max_nums <= MAX_POP_NUMS:
            raise PopError(INVALID_PARAMETER, f"maxMsgNums {max_nums} is not in [1, {MAX_POP_NUMS}]")
        self.checks.check_invisible(invisible_ms)
        group_cfg = self.check_group(group)
        if topic.startswith(RETRY_PREFIX):
            raise PopError(INVALID_PARAMETER, f"pop the topic, not its retry topic {topic}")
        cfg = self.check_topic(topic, queue_id, any_queue=True)
        expression_type = expression_type or EXPRESSION_TAG
        if expression_type != EXPRESSION_TAG and not b.settings.enable_property_filter:
            raise PopError(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        try:
            flt = self.checks.store_filter(expression_type, expression or "*")
        except (ValueError, LookupError) as exc:
            raise PopError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {exc}"
            ) from None
        order = order or bool(getattr(group_cfg, "consume_message_orderly", False))
        poll_ms = max(0, min(poll_ms, b.settings.max_suspend_ms))
        deadline = time.monotonic() + poll_ms / 1000
        queues = list(range(cfg.read_queue_nums)) if queue_id == -1 else [queue_id]
        topics = [topic, retry_topic_v1(topic, group)]
        waiters = self.waiters
        while True:
            if len(self.table.cks) >= MAX_CHECKPOINTS:
                raise PopError(
                    ResponseCode.SYSTEM_BUSY, f"{MAX_CHECKPOINTS} pop batches are in flight; ack first"
                )
            # Watched before the read: an arrival or an acknowledgement (the confirm offset) after
            # it wakes the wait below, not only one after the wait began (polling.py).
            watch = waiters.watch(topics) if poll_ms > 0 else None
            try:
                try:
                    result = await self._pop_once(
                        group, topic, queues, max_nums, invisible_ms, init_mode, flt, order, group_cfg
                    )
                except ReviveLogError as exc:
                    # batches recorded before the refusal stay in flight and come back after their time
                    raise PopError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
                remaining = deadline - time.monotonic()
                if result.found or remaining <= 0 or watch is None or not b.running:
                    return result
                if waiters.total - len(watch.topics) >= MAX_POLLERS:  # the others held
                    raise PopError(POLLING_FULL, "too many pops are waiting")
                await waiters.until(watch, min(remaining, self.table.next_order_expiry(group, topic)))
            finally:
                if watch is not None:
                    waiters.unwatch(watch)
            if closed is not None and closed():
                return result

    def _next_order_expiry(self, group: str, topic: str) -> float:
        """Seconds until a FIFO checkpoint of the group's topic expires (a blocked queue frees up)."""
        now = now_ms()
        best = 3600.0
        for (g, t, _q), ids in self.table.order.items():
            if g == group and t == topic:
                for i in ids:
                    ck = self.table.cks.get(i)
                    if ck is not None and not ck.done:
                        best = min(best, max(ck.deadline - now, 0) / 1000 + 0.001)
        return best

    async def _pop_once(
        self,
        group: str,
        topic: str,
        queues: list[int],
        max_nums: int,
        invisible_ms: int,
        init_mode: int,
        flt: MessageFilter | None,
        order: bool,
        group_cfg: Any,
    ) -> PopResult:
        pop_time = now_ms()
        result = PopResult(pop_time, invisible_ms, ORDER_REVIVE_QUEUE if order else 0, 0)
        start = _random.randrange(len(queues))
        ring = queues[start:] + queues[:start]
        sources: list[tuple[str, list[int]]] = [(topic, ring)]
        rcfg = None if order else self.checks.retry_config(group, topic)
        if rcfg is not None:
            retry = rcfg.topic_name
            rq = list(range(rcfg.read_queue_nums))
            if _random.randrange(100) < RETRY_FIRST_PERCENT:
                sources.insert(0, (retry, rq))
            else:
                sources.append((retry, rq))
        want = max_nums
        for src, qids in sources:
            for qid in qids:
                if want <= 0:
                    break
                batch = await self._pop_queue(group, src, qid, want, result, init_mode, flt, order, group_cfg)
                if batch is not None:
                    result.batches.append(batch)
                    want -= len(batch.offsets)
        bound = self.broker.read_bound
        for qid in queues:
            rest = bound.max_offset(topic, qid) - self.table.offsets.get((group, topic, qid), 0)
            result.rest_num += max(rest, 0)
        if result.found:
            self.broker.stats.on_get(
                group,
                topic,
                sum(len(b.offsets) for b in result.batches),
                sum(len(x) for b in result.batches for x in b.wire),
            )
        return result

    async def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        want: int,
        result: PopResult,
        init_mode: int,
        flt: MessageFilter | None,
        order: bool,
        group_cfg: Any,
    ) -> PoppedBatch | None:
        key = (group, topic, qid)
        attempt = 0
        redo: set[int] | None = None
        old_end = -1
        if order:
            ids = self.table.order.get(key)
            if ids:
                open_cks = [self.table.cks[i] for i in ids if i in self.table.cks]
                now = now_ms()
                if any(not ck.done and ck.deadline > now for ck in open_cks):
                    return None  # the previous batch is neither acknowledged nor expired
                unacked = sorted(o for ck in open_cks for o in ck.unacked())
                if unacked:
                    attempt = max(ck.attempt for ck in open_cks) + 1
                    old_end = self.table.offset(key, init_mode)
                    redo = set(unacked)
                    if attempt > group_cfg.retry_max_times:
                        await self.reviver.dead_letter(group, topic, qid, unacked)
                        redo = None
                        attempt = 0
                    else:
                        self.table.set_offset(key, unacked[0])
                for ck in open_cks:
                    self.table.retire(ck)
        offset = self.table.offset(key, init_mode)
        read = self.broker.read_bound.get_message  # no record past the confirm offset
        res = read(group, topic, qid, offset, want, flt)
        if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY) or (
            res.status is GetStatus.NO_MATCHED_MESSAGE and res.next_begin_offset > offset
        ):
            self.table.set_offset(key, res.next_begin_offset)
            offset = res.next_begin_offset
            res = read(group, topic, qid, offset, want, flt)
        if not res.buffers:
            if res.next_begin_offset > offset:
                self.table.set_offset(key, res.next_begin_offset)
            return None
        buffers = list(res.buffers)
        offsets = list(res.queue_offsets)
        next_offset = res.next_begin_offset
        wire: tuple[Any, ...] = res.wire_parts
        if redo is not None:
            wire = ()
            keep = [i for i, o in enumerate(offsets) if o in redo or o >= old_end]
            buffers = [buffers[i] for i in keep]
            offsets = [offsets[i] for i in keep]
            if next_offset < old_end and not any(o in redo and o >= next_offset for o in redo):
                next_offset = max(next_offset, old_end)
            if not offsets:
                self.table.set_offset(key, next_offset)
                return None
        ck = Checkpoint(
            self.table.next_id,
            group,
            topic,
            qid,
            result.pop_time,
            result.invisible_ms,
            result.revive_qid,
            next_offset,
            attempt,
            tuple(offsets),
        )
        while (group, topic, qid, ck.start, ck.pop_time) in self.table.by_key:  # same start, same ms
            ck.pop_time += 1
        if ck.pop_time != result.pop_time:
            # every batch of one answer shares the header's popTime: give up this queue this time
            return None
        self.log.append(ck.record())  # in the revive log before the answer leaves
        self.table.next_id += 1
        self.table.register(ck)
        self.table.offsets[key] = next_offset
        self.table.commit_offset(key, next_offset)
        return PoppedBatch(topic, qid, ck.start, ck.offsets, tuple(buffers), attempt, wire or tuple(buffers))

    def peek(self, group: str, topic: str, queue_id: int = -1, max_nums: int = 32) -> PopResult:
        """PEEK_MESSAGE: what the group's next pops would read, taking nothing (no checkpoint, no
        invisibility, no offset moved)."""
        if not 1 <= max_nums <= MAX_POP_NUMS:
            raise PopError(INVALID_PARAMETER, f"maxMsgNums {max_nums} is not in [1, {MAX_POP_NUMS}]")
        self.check_group(group)
        if topic.startswith(RETRY_PREFIX):
            raise PopError(INVALID_PARAMETER, f"peek the topic, not its retry topic {topic}")
        cfg = self.check_topic(topic, queue_id, any_queue=True)
        result = PopResult(now_ms(), 0, 0, 0)
        sources = [(topic, list(range(cfg.read_queue_nums)) if queue_id == -1 else [queue_id])]
        rcfg = self.checks.retry_config(group, topic)
        if rcfg is not None:
            sources.append((rcfg.topic_name, list(range(rcfg.read_queue_nums))))
        want = max_nums
        store = self.broker.store
        for src, qids in sources:
            for qid in qids:
                off = self.table.offsets.get((group, src, qid))
                if off is None:
                    off = max(
                        self.broker.offsets.query(group, src, qid), store.get_min_offset_in_queue(src, qid)
                    )
                rest = self.broker.read_bound.max_offset(src, qid) - off
                result.rest_num += max(rest, 0)
                if want <= 0 or rest <= 0:
                    continue
                res = self.broker.read_bound.get_message(group, src, qid, off, want)
                if res.buffers:
                    offsets = tuple(res.queue_offsets)
                    result.batches.append(
                        PoppedBatch(src, qid, offsets[0], offsets, tuple(res.buffers), 0, res.wire_parts)
                    )
                    want -= len(offsets)
        return result

    def polling_num(self, topic: str) -> int:
        """Pops and notifications waiting on ``topic`` (POLLING_INFO)."""
        return self.waiters.count(topic)

    def has_message(self, group: str, topic: str, queue_id: int = -1) -> bool:
        cfg = self.check_topic(topic, queue_id, any_queue=True)
        bound = self.broker.read_bound
        order = self.checks.is_orderly(group)
        qids = range(cfg.read_queue_nums) if queue_id == -1 else [queue_id]
        now = now_ms()
        for q in qids:
            key = (group, topic, q)
            if order and any(
                (ck := self.table.cks.get(i)) is not None and not ck.done and ck.deadline > now
                for i in self.table.order.get(key, ())
            ):
                continue
            if bound.max_offset(topic, q) > self.table.offset(key, INIT_MIN):
                return True
        rcfg = None if order else self.checks.retry_config(group, topic)
        if rcfg is not None:
            retry = rcfg.topic_name
            for q in range(rcfg.read_queue_nums):
                if bound.max_offset(retry, q) > self.table.offset((group, retry, q), INIT_MIN):
                    return True
        return False

    async def notification(self, group: str, topic: str, queue_id: int = -1, poll_ms: int = 0) -> bool:
        """Whether the group has a message to pop on ``topic`` (waits up to ``poll_ms`` for one)."""
        self.check_group(group)
        poll_ms = max(0, min(poll_ms, self.broker.settings.max_suspend_ms))
        deadline = time.monotonic() + poll_ms / 1000
        topics = [topic, retry_topic_v1(topic, group)]
        waiters = self.waiters
        while True:
            watch = waiters.watch(topics) if poll_ms > 0 else None  # before the check, as pop's
            try:
                if self.has_message(group, topic, queue_id):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or watch is None:
                    return False
                await waiters.until(watch, min(remaining, self.table.next_order_expiry(group, topic)))
            finally:
                if watch is not None:
                    waiters.unwatch(watch)

    # ------------------------------------------------------------------ assignment
    def assignment(
        self, topic: str, group: str, client_id: str, message_model: str = "CLUSTERING"
    ) -> tuple[str, list[int]]:
        """(mode, queue ids) QUERY_ASSIGNMENT hands ``client_id``: ``[-1]`` (every queue) in POP mode."""
        if topic.startswith(RETRY_PREFIX):
            raise PopError(INVALID_PARAMETER, f"query the assignment of the topic, not of {topic}")
        cfg = self.check_topic(topic, -1, any_queue=True)
        self.check_group(group)
        mode = self.modes.mode(topic, group)
        queues = list(range(cfg.read_queue_nums))
        if message_model == "BROADCASTING":
            return "PULL", queues
        if mode == "POP":
            return "POP", [-1]
        info = self.broker.consumers.get(group)
        cids = info.client_ids() if info is not None else []
        if client_id not in cids:
            cids = sorted([*cids, client_id])
        return mode, allocate_averagely(queues, cids, client_id)

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict[str, int]:
        return {
            "popCheckpoints": len(self.table.cks),
            "popInFlight": self.table.in_flight(),
            "popRevived": self.reviver.revived,
            "popDeadLettered": self.reviver.dead_lettered,
            "popReviveLagMs": self.table.revive_backlog_ms(),
            "popJournalBytes": self.log.size,
        }
