"""The POP engine: pop, ack, change invisibility, revive, FIFO order and long polling.

Callable with plain values (the remoting codecs in :mod:`tidemq.broker.processors.pop` and, later,
a gRPC front end sit on top).  State lives in the :class:`~tidemq.broker.pop.journal.Journal`; in
memory there is one :class:`Checkpoint` per pop *batch* (its acks a bit mask), bounded by
:data:`MAX_CHECKPOINTS`.

* A pop reads a queue from the group's pop offset, writes a checkpoint, moves the offset past the
  batch and answers; the messages are invisible until ``popTime + invisibleTime``.
* An ack sets the message's bit; a handle that names no open checkpoint, another group, a
  position already acknowledged or a different invisible time is refused.
* The revive task wakes at the earliest deadline: every unacknowledged message of an expired
  checkpoint is written to ``%RETRY%<group>_<topic>`` with its reconsume count + 1 (past the
  group's ``retryMaxTimes``: to ``%DLQ%<group>``), then the checkpoint is retired.  A crash between
  the two writes delivers those messages twice, never zero times.
* FIFO (``consumeMessageOrderly`` groups, or ``order=true`` pops): a queue with an open, unexpired
  checkpoint is skipped; once it expires, the next pop re-delivers its unacknowledged messages from
  the same queue with the attempt count (RocketMQ's ConsumerOrderInfoManager), no retry topic.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import logging
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidemq.broker.pop.assignment import RequestModeTable, allocate_averagely
from tidemq.broker.pop.handle import (
    DLQ_PREFIX,
    ORDER_REVIVE_QUEUE,
    RETRY_PREFIX,
    AckHandle,
    HandleError,
    retry_mark,
    retry_topic_v1,
)
from tidemq.broker.pop.journal import (
    COMPACT_BYTES,
    Checkpoint,
    Journal,
    ack_record,
    done_record,
    live_records,
    offset_record,
)
from tidemq.broker.pop.polling import PopWaiters
from tidemq.broker.pop.results import (
    INIT_MAX,
    INIT_MIN,
    INVALID_PARAMETER,
    MAX_CHECKPOINTS,
    MAX_INVISIBLE_MS,
    MAX_POLLERS,
    MAX_POP_NUMS,
    MIN_INVISIBLE_MS,
    POLLING_FULL,
    RETRY_FIRST_PERCENT,
    REVIVE_BATCH,
    SYNC_INTERVAL_S,
    PopError,
    PoppedBatch,
    PopResult,
    now_ms,
)
from tidemq.broker.pop.revive import dead_letters, revived_messages
from tidemq.filter import EXPRESSION_TAG, MessageFilter, SelectsEverything
from tidemq.futures import resolved
from tidemq.message import MessageInner
from tidemq.perm import PERM_READ, PERM_WRITE, is_readable
from tidemq.remoting.codes import ResponseCode
from tidemq.store import GetStatus
from tidemq.tasks import supervise

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)


class PopService:
    """POP consumption for one broker; :meth:`attach` before the store starts, then :meth:`start`."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.journal = Journal(broker.data_dir / "pop" / "journal.log")
        #: Each group's request mode (SET_MESSAGE_REQUEST_MODE), for QUERY_ASSIGNMENT.
        self.modes = RequestModeTable(broker.data_dir / "config" / "messageRequestMode.json")
        self._cks: dict[int, Checkpoint] = {}
        self._by_key: dict[tuple[str, str, int, int, int], Checkpoint] = {}
        self._heap: list[tuple[int, int]] = []
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._order: dict[tuple[str, str, int], set[int]] = {}  # FIFO queue -> its open checkpoints
        self._inflight: dict[tuple[str, str, int], int] = {}  # queue -> unacknowledged popped messages
        self._next_id = 1
        self.waiters = PopWaiters()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._filters: dict[tuple[str, str], MessageFilter | None] = {}
        self.revived = 0
        self.dead_lettered = 0
        self.revive_lag_ms = 0  # how late the last revive ran past its deadline

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        self.modes.load()
        state = self.journal.replay()
        self._offsets = state.offsets
        self._next_id = state.last_id + 1
        for ck in state.checkpoints.values():
            self._register(ck)
        if state.checkpoints:
            log.info("pop: %d open checkpoints recovered from %s", len(state.checkpoints), self.journal.path)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Replay the journal and listen for arrivals (before the store starts)."""
        self.load()
        self.waiters.bind(loop)
        self.broker.store.add_arrival_listener(self.waiters.on_arrival, self.waiters.is_waited_on)

    def start(self) -> None:
        self._tasks.append(supervise(self._revive_loop, "tidemq-pop-revive"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.waiters.release_all()
        self.journal.close()

    # ------------------------------------------------------------------ bookkeeping
    def _count(self, ck: Checkpoint, delta: int) -> None:
        key = (ck.group, ck.topic, ck.queue_id)
        n = self._inflight.get(key, 0) + delta
        if n > 0:
            self._inflight[key] = n
        else:
            self._inflight.pop(key, None)

    def _register(self, ck: Checkpoint) -> None:
        self._cks[ck.id] = ck
        self._count(ck, len(ck.offsets) - ck.acked.bit_count())
        self._by_key[(ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time)] = ck
        heapq.heappush(self._heap, (ck.deadline, ck.id))
        if len(self._heap) > 2 * len(self._cks) + 4096:
            # Acknowledged checkpoints leave their entries behind until their deadline: with long
            # invisible times those would pile up, so the heap is rebuilt from the open ones.
            self._heap = [(c.deadline, c.id) for c in self._cks.values() if not c.done]
            heapq.heapify(self._heap)
        if ck.revive_qid == ORDER_REVIVE_QUEUE:
            self._order.setdefault((ck.group, ck.topic, ck.queue_id), set()).add(ck.id)
        if self._heap and self._heap[0][1] == ck.id:
            self._wake.set()

    def _retire(self, ck: Checkpoint, record: bool = True) -> None:
        if self._cks.pop(ck.id, None) is None:
            return
        self._count(ck, ck.acked.bit_count() - len(ck.offsets))
        self._by_key.pop((ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time), None)
        if record:
            self.journal.append(done_record(ck.id))
        if ck.revive_qid == ORDER_REVIVE_QUEUE:
            ids = self._order.get((ck.group, ck.topic, ck.queue_id))
            if ids is not None:
                ids.discard(ck.id)

    def _offset(self, key: tuple[str, str, int], init_mode: int) -> int:
        off = self._offsets.get(key)
        if off is None:
            group, topic, qid = key
            off = self.broker.offsets.query(group, topic, qid)
            if off < 0:
                store = self.broker.store
                if init_mode == INIT_MAX and not topic.startswith(RETRY_PREFIX):
                    off = store.get_max_offset_in_queue(topic, qid)
                else:
                    off = store.get_min_offset_in_queue(topic, qid)
            self._offsets[key] = off
        return off

    def _set_offset(self, key: tuple[str, str, int], off: int, journal: bool = True) -> None:
        if self._offsets.get(key) == off:
            return
        self._offsets[key] = off
        if journal:
            self.journal.append(offset_record(*key, off))
        try:
            self.broker.offsets.commit(key[0], key[1], key[2], off)
        except ValueError:
            pass

    def store_filter(self, expression_type: str, expression: str) -> MessageFilter | None:
        key = (expression_type, expression)
        if key in self._filters:
            return self._filters[key]
        factory = self.broker.filters.get(expression_type)
        if factory is None:
            raise LookupError(f"expression type {expression_type!r} is not installed")
        flt: MessageFilter | None = factory.compile(expression)
        if isinstance(flt, SelectsEverything) and flt.matches_all:
            flt = None
        if len(self._filters) > 1024:
            self._filters.clear()
        self._filters[key] = flt
        return flt

    # ------------------------------------------------------------------ checks
    def check_group(self, group: str) -> Any:
        if not self.broker.is_master:
            # the journal lives on the master alone: a slave's pops and acks would be lost on its return
            raise PopError(ResponseCode.NO_PERMISSION, "POP is served by the master; this broker is a slave")
        cfg = self.broker.groups.find_or_create(group)
        if cfg is None:
            raise PopError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
            )
        if not cfg.consume_enable:
            raise PopError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        return cfg

    def check_topic(self, topic: str, queue_id: int, *, any_queue: bool) -> Any:
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not is_readable(cfg.perm):
            raise PopError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if not (any_queue and queue_id == -1) and not 0 <= queue_id < cfg.read_queue_nums:
            raise PopError(
                INVALID_PARAMETER,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{cfg.read_queue_nums}]",
            )
        return cfg

    @staticmethod
    def _check_invisible(invisible_ms: int) -> None:
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise PopError(
                INVALID_PARAMETER,
                f"invisibleTime {invisible_ms} ms is out of range [{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]",
            )

    def retry_config(self, group: str, topic: str) -> Any:
        """The group's POP retry topic, None while it has none.  Made again when the store holds
        messages for it but the table lost it (a crash before the topic table was written)."""
        retry = retry_topic_v1(topic, group)
        cfg = self.broker.topics.get(retry)
        if cfg is None and self.broker.store.get_max_offset_in_queue(retry, 0) > 0:
            cfg = self.broker.topics.create_in_send_back(retry, 1, PERM_READ | PERM_WRITE)
        return cfg

    def is_orderly(self, group: str) -> bool:
        cfg = self.broker.groups.get(group)
        return bool(getattr(cfg, "consume_message_orderly", False))

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
        self._check_invisible(invisible_ms)
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
            flt = self.store_filter(expression_type, expression or "*")
        except (ValueError, LookupError) as exc:
            raise PopError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {exc}"
            ) from None
        order = order or bool(getattr(group_cfg, "consume_message_orderly", False))
        poll_ms = max(0, min(poll_ms, b.settings.max_suspend_ms))
        deadline = time.monotonic() + poll_ms / 1000
        queues = list(range(cfg.read_queue_nums)) if queue_id == -1 else [queue_id]
        while True:
            if len(self._cks) >= MAX_CHECKPOINTS:
                raise PopError(
                    ResponseCode.SYSTEM_BUSY, f"{MAX_CHECKPOINTS} pop batches are in flight; ack first"
                )
            result = await self._pop_once(
                group, topic, queues, max_nums, invisible_ms, init_mode, flt, order, group_cfg
            )
            remaining = deadline - time.monotonic()
            if result.found or remaining <= 0 or not b.running:
                return result
            if self.waiters.total >= MAX_POLLERS:
                raise PopError(POLLING_FULL, "too many pops are waiting")
            await self.waiters.wait(
                [topic, retry_topic_v1(topic, group)], min(remaining, self._next_order_expiry(group, topic))
            )
            if closed is not None and closed():
                return result

    def _next_order_expiry(self, group: str, topic: str) -> float:
        """Seconds until a FIFO checkpoint of the group's topic expires (a blocked queue frees up)."""
        now = now_ms()
        best = 3600.0
        for (g, t, _q), ids in self._order.items():
            if g == group and t == topic:
                for i in ids:
                    ck = self._cks.get(i)
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
        start = random.randrange(len(queues))
        ring = queues[start:] + queues[:start]
        sources: list[tuple[str, list[int]]] = [(topic, ring)]
        rcfg = None if order else self.retry_config(group, topic)
        if rcfg is not None:
            retry = rcfg.topic_name
            rq = list(range(rcfg.read_queue_nums))
            if random.randrange(100) < RETRY_FIRST_PERCENT:
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
        store = self.broker.store
        for qid in queues:
            rest = store.get_max_offset_in_queue(topic, qid) - self._offsets.get((group, topic, qid), 0)
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
            ids = self._order.get(key)
            if ids:
                open_cks = [self._cks[i] for i in ids if i in self._cks]
                now = now_ms()
                if any(not ck.done and ck.deadline > now for ck in open_cks):
                    return None  # the previous batch is neither acknowledged nor expired
                unacked = sorted(o for ck in open_cks for o in ck.unacked())
                if unacked:
                    attempt = max(ck.attempt for ck in open_cks) + 1
                    old_end = self._offset(key, init_mode)
                    redo = set(unacked)
                    if attempt > group_cfg.retry_max_times:
                        await self._dead_letter(group, topic, qid, unacked)
                        redo = None
                        attempt = 0
                    else:
                        self._set_offset(key, unacked[0])
                for ck in open_cks:
                    self._retire(ck)
        offset = self._offset(key, init_mode)
        store = self.broker.store
        res = store.get_message(group, topic, qid, offset, want, flt)
        if res.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY) or (
            res.status is GetStatus.NO_MATCHED_MESSAGE and res.next_begin_offset > offset
        ):
            self._set_offset(key, res.next_begin_offset)
            offset = res.next_begin_offset
            res = store.get_message(group, topic, qid, offset, want, flt)
        if not res.buffers:
            if res.next_begin_offset > offset:
                self._set_offset(key, res.next_begin_offset)
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
                self._set_offset(key, next_offset)
                return None
        ck = Checkpoint(
            self._next_id,
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
        while (group, topic, qid, ck.start, ck.pop_time) in self._by_key:  # same start, same ms
            ck.pop_time += 1
        if ck.pop_time != result.pop_time:
            # every batch of one answer shares the header's popTime: give up this queue this time
            return None
        self._next_id += 1
        self.journal.append(ck.record())  # on disk before the answer leaves
        self._register(ck)
        self._offsets[key] = next_offset
        try:
            self.broker.offsets.commit(group, topic, qid, next_offset)
        except ValueError:
            pass
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
        rcfg = self.retry_config(group, topic)
        if rcfg is not None:
            sources.append((rcfg.topic_name, list(range(rcfg.read_queue_nums))))
        want = max_nums
        store = self.broker.store
        for src, qids in sources:
            for qid in qids:
                off = self._offsets.get((group, src, qid))
                if off is None:
                    off = max(
                        self.broker.offsets.query(group, src, qid), store.get_min_offset_in_queue(src, qid)
                    )
                rest = store.get_max_offset_in_queue(src, qid) - off
                result.rest_num += max(rest, 0)
                if want <= 0 or rest <= 0:
                    continue
                res = store.get_message(group, src, qid, off, want)
                if res.buffers:
                    offsets = tuple(res.queue_offsets)
                    result.batches.append(
                        PoppedBatch(src, qid, offsets[0], offsets, tuple(res.buffers), 0, res.wire_parts)
                    )
                    want -= len(offsets)
        return result

    # ------------------------------------------------------------------ ack
    def _find(
        self, group: str, topic: str, queue_id: int, handle: AckHandle, offset: int
    ) -> tuple[Checkpoint, int]:
        if retry_mark(topic) != handle.retry:
            raise PopError(
                INVALID_PARAMETER, f"the handle names retry mark {handle.retry}, the request topic {topic}"
            )
        if handle.queue_id != queue_id or handle.offset != offset:
            raise PopError(
                INVALID_PARAMETER,
                f"the handle names queue {handle.queue_id} offset {handle.offset}, the request queue {queue_id} offset {offset}",
            )
        ck = self._by_key.get((group, topic, queue_id, handle.ck_offset, handle.pop_time))
        if ck is None or ck.invisible_ms != handle.invisible_time:
            raise PopError(
                ResponseCode.NO_MESSAGE,
                f"no message in flight for this handle of group {group} ({topic}:{queue_id}@{offset}): "
                "expired and redelivered with a new handle, acknowledged already, or never popped",
            )
        i = bisect.bisect_left(ck.offsets, offset)
        if i >= len(ck.offsets) or ck.offsets[i] != offset:
            raise PopError(ResponseCode.NO_MESSAGE, f"offset {offset} was not popped with this handle")
        if ck.acked >> i & 1:
            raise PopError(ResponseCode.NO_MESSAGE, f"{topic}:{queue_id}@{offset} is acknowledged already")
        return ck, i

    def _parse(self, extra_info: str) -> AckHandle:
        try:
            return AckHandle.parse(extra_info)
        except HandleError as exc:
            raise PopError(INVALID_PARAMETER, str(exc)) from None

    def ack(self, group: str, topic: str, queue_id: int, offset: int, extra_info: str) -> None:
        """Acknowledge one popped message (ACK_MESSAGE); ``topic`` is the stored (retry) topic."""
        handle = self._parse(extra_info)
        self.check_group(group)
        self.check_topic(topic, queue_id, any_queue=False)
        ck, i = self._find(group, topic, queue_id, handle, offset)
        self._set_acked(ck, 1 << i)

    def _set_acked(self, ck: Checkpoint, bits: int) -> None:
        bits &= ~ck.acked
        self.journal.append(ack_record(ck.id, bits))  # first: an ack the disk refused is not taken
        ck.acked |= bits
        self._count(ck, -bits.bit_count())
        if ck.done:
            if ck.revive_qid == ORDER_REVIVE_QUEUE:
                self.waiters.notify(ck.topic)  # the FIFO queue is free for the next batch
                # kept until the next pop of the queue retires it (its offsets stay the queue's progress)
                self._by_key.pop((ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time), None)
            else:
                self._retire(ck, record=False)  # a full mask retires it at replay too

    def batch_ack(
        self,
        group: str,
        topic: str,
        retry: str,
        queue_id: int,
        start_offset: int,
        pop_time: int,
        invisible_ms: int,
        revive_qid: int,
        offsets: Sequence[int],
    ) -> tuple[int, int]:
        """One BatchAck entry: acknowledge ``offsets`` of a checkpoint; (acknowledged, refused)."""
        from tidemq.broker.pop.handle import real_topic

        try:
            stored = real_topic(topic, group, retry)
        except ValueError as exc:
            raise PopError(INVALID_PARAMETER, str(exc)) from None
        self.check_group(group)
        self.check_topic(stored, queue_id, any_queue=False)
        if retry_mark(stored) != retry:
            raise PopError(INVALID_PARAMETER, f"retry mark {retry} does not name {stored}")
        ck = self._by_key.get((group, stored, queue_id, start_offset, pop_time))
        if ck is None or ck.invisible_ms != invisible_ms:
            return 0, len(offsets)
        bits = 0
        for off in offsets:
            i = bisect.bisect_left(ck.offsets, off)
            if i < len(ck.offsets) and ck.offsets[i] == off and not ck.acked >> i & 1:
                bits |= 1 << i
        done = bits.bit_count()
        if bits:
            self._set_acked(ck, bits)
        return done, len(offsets) - done

    def change_invisible(
        self, group: str, topic: str, queue_id: int, offset: int, extra_info: str, invisible_ms: int
    ) -> tuple[int, int, int]:
        """Make a popped message invisible ``invisible_ms`` from now; (popTime, invisibleTime, reviveQid)
        of its new handle (the old one is spent)."""
        handle = self._parse(extra_info)
        self._check_invisible(invisible_ms)
        self.check_group(group)
        self.check_topic(topic, queue_id, any_queue=False)
        ck, i = self._find(group, topic, queue_id, handle, offset)
        pop_time = now_ms()
        while (group, topic, queue_id, offset, pop_time) in self._by_key:
            pop_time += 1
        new = Checkpoint(
            self._next_id,
            group,
            topic,
            queue_id,
            pop_time,
            invisible_ms,
            ck.revive_qid,
            -1,
            ck.attempt,
            (offset,),
        )
        self._next_id += 1
        self.journal.append(new.record())  # the new one first: a crash in between redelivers, never loses
        self._register(new)
        self._set_acked(ck, 1 << i)
        return pop_time, invisible_ms, ck.revive_qid

    # ------------------------------------------------------------------ revive
    async def _revive_loop(self) -> None:
        last_sync = time.monotonic()
        while True:
            self._wake.clear()
            now = now_ms()
            due: list[Checkpoint] = []
            while self._heap and self._heap[0][0] <= now and len(due) < REVIVE_BATCH:
                _, ck_id = heapq.heappop(self._heap)
                ck = self._cks.get(ck_id)
                if ck is None or ck.done or any(c is ck for c in due):  # acked, revived, or twice here
                    continue
                if ck.revive_qid == ORDER_REVIVE_QUEUE:
                    self.waiters.notify(ck.topic)  # expired: its queue's next pop re-delivers
                    continue
                due.append(ck)
            if due and not self.broker.is_master:
                for ck in due:
                    heapq.heappush(self._heap, (now + 1000, ck.id))
            elif due:
                await self._revive_many(due)
                if self._heap and self._heap[0][0] <= now_ms():
                    continue  # more are due: no sync, no wait
            if time.monotonic() - last_sync >= SYNC_INTERVAL_S:
                last_sync = time.monotonic()
                await asyncio.to_thread(self.journal.sync)
                if self.journal.size > COMPACT_BYTES:
                    self.compact()
            wait = SYNC_INTERVAL_S
            if self._heap:
                wait = min(wait, max(self._heap[0][0] - now_ms(), 0) / 1000)
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    def compact(self) -> None:
        """Rewrite the journal with the live state only."""
        before = self.journal.size
        self.journal.rewrite(live_records(self._offsets, list(self._cks.values())))
        log.info("pop journal compacted: %d -> %d bytes", before, self.journal.size)

    async def _revive_many(self, cks: list[Checkpoint]) -> None:
        """Write the unacknowledged messages of expired checkpoints back (all puts in flight
        together), then retire each checkpoint whose messages were all stored."""
        b = self.broker
        planned: list[tuple[Checkpoint, list[tuple[MessageInner, Any]]]] = []
        for ck in cks:
            try:
                msgs = revived_messages(self.broker, ck)
            except Exception:
                log.exception("pop: revive of checkpoint %d failed; retrying in 1 s", ck.id)
                heapq.heappush(self._heap, (now_ms() + 1000, ck.id))
                continue
            planned.append((ck, [(m, b.store.put_message(m)) for m in msgs]))
        for ck, puts in planned:
            results = await asyncio.gather(*(resolved(f) for _, f in puts), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException) or not r.ok]
            if failed:
                # Retried whole: the ones stored now are delivered twice, none is lost.
                log.warning(
                    "pop: revive of checkpoint %d: %d messages not stored (%s); retrying in 1 s",
                    ck.id,
                    len(failed),
                    failed[0],
                )
                heapq.heappush(self._heap, (now_ms() + 1000, ck.id))
                continue
            for (m, _), r in zip(puts, results, strict=True):
                assert not isinstance(r, BaseException)
                b.stats.on_put(m.topic, 1, r.wrote_bytes)
                if m.topic.startswith(DLQ_PREFIX):
                    self.dead_lettered += 1
                else:
                    self.revived += 1
            self.revive_lag_ms = max(now_ms() - ck.deadline, 0)
            self._retire(ck)

    async def _dead_letter(self, group: str, topic: str, qid: int, offsets: list[int]) -> None:
        for msg in dead_letters(self.broker, group, topic, qid, offsets):
            put = await resolved(self.broker.store.put_message(msg))
            if put.ok:
                self.dead_lettered += 1

    def polling_num(self, topic: str) -> int:
        """Pops and notifications waiting on ``topic`` (POLLING_INFO)."""
        return self.waiters.count(topic)

    def has_message(self, group: str, topic: str, queue_id: int = -1) -> bool:
        cfg = self.check_topic(topic, queue_id, any_queue=True)
        store = self.broker.store
        order = self.is_orderly(group)
        qids = range(cfg.read_queue_nums) if queue_id == -1 else [queue_id]
        now = now_ms()
        for q in qids:
            key = (group, topic, q)
            if order and any(
                (ck := self._cks.get(i)) is not None and not ck.done and ck.deadline > now
                for i in self._order.get(key, ())
            ):
                continue
            if store.get_max_offset_in_queue(topic, q) > self._offset(key, INIT_MIN):
                return True
        rcfg = None if order else self.retry_config(group, topic)
        if rcfg is not None:
            retry = rcfg.topic_name
            for q in range(rcfg.read_queue_nums):
                if store.get_max_offset_in_queue(retry, q) > self._offset((group, retry, q), INIT_MIN):
                    return True
        return False

    async def notification(self, group: str, topic: str, queue_id: int = -1, poll_ms: int = 0) -> bool:
        """Whether the group has a message to pop on ``topic`` (waits up to ``poll_ms`` for one)."""
        self.check_group(group)
        deadline = time.monotonic() + max(0, min(poll_ms, self.broker.settings.max_suspend_ms)) / 1000
        while True:
            if self.has_message(group, topic, queue_id):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await self.waiters.wait(
                [topic, retry_topic_v1(topic, group)], min(remaining, self._next_order_expiry(group, topic))
            )

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
    def in_flight(self, group: str | None = None, topic: str | None = None) -> int:
        """Popped, unacknowledged messages (of one group / topic, retry topics included)."""
        n = 0
        for (g, t, _q), count in self._inflight.items():
            if group is not None and g != group:
                continue
            if topic is not None and t != topic and t != retry_topic_v1(topic, g):
                continue
            n += count
        return n

    def in_flight_table(self) -> dict[tuple[str, str], int]:
        """(group, stored topic) -> popped, unacknowledged messages."""
        out: dict[tuple[str, str], int] = {}
        for (g, t, _q), count in self._inflight.items():
            out[(g, t)] = out.get((g, t), 0) + count
        return out

    def queue_progress(self, group: str, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(pop offset, messages in flight) of a queue the group pops; None when it never popped it."""
        pulled = self._offsets.get((group, topic, queue_id))
        if pulled is None:
            return None
        return pulled, self._inflight.get((group, topic, queue_id), 0)

    def revive_backlog_ms(self) -> int:
        """How far past its deadline the oldest unrevived checkpoint is (0: revive is on time)."""
        now = now_ms()
        for _, ck_id in heapq.nsmallest(64, self._heap):
            ck = self._cks.get(ck_id)
            if ck is not None and not ck.done and ck.revive_qid != ORDER_REVIVE_QUEUE:
                return max(now - ck.deadline, 0)
        return 0

    def figures(self) -> dict[str, int]:
        return {
            "popCheckpoints": len(self._cks),
            "popInFlight": self.in_flight(),
            "popRevived": self.revived,
            "popDeadLettered": self.dead_lettered,
            "popReviveLagMs": self.revive_backlog_ms(),
            "popJournalBytes": self.journal.size,
        }
