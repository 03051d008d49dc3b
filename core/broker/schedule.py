"""Delayed messages: the SCHEDULE_TOPIC_XXXX swap and the per-level delivery service.

RocketMQ keeps a delayed message in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, with its real
topic and queue in the REAL_TOPIC / REAL_QID properties, and one timer task per level moves it to
the real topic when due.  Every message of one level waits the same time, so a level's queue is
ordered by delivery time and its task only ever looks at the head.

RocketMQ stores the delivery timestamp as the ConsumeQueue tags code, and so does the mmap store
(:func:`tidemq.delay.schedule_tags_code`: a RocketMQ broker opening the data directory schedules the
waiting messages right).  The store contract does not expose tags codes, so this service derives
the delivery time from the record, ``store timestamp + delay of the level``: the same value.
Changing ``delay_levels`` therefore also moves messages already waiting (RocketMQ would keep the
old time).

Progress per level is kept in ``config/delayOffset.json`` (``{"offsetTable": {"<level>": offset}}``,
as RocketMQ's ``delayOffset.json``) and served to slaves through GET_ALL_DELAY_OFFSET.  Delivery is
at least once: after a crash the messages between the last persisted offset and the real progress
are delivered again.

A level reads its queue through the broker's :class:`~tidemq.broker.confirmed.ReadBound`, as
consumers do: on a controller SYNC master it stops at the confirm offset (RocketMQ 5 dispatches
SCHEDULE_TOPIC_XXXX's consume queues only up to it), so the progress never passes a message a
failover can cut.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.arrival import listen_to_topic
from tidemq.delay import (
    SCHEDULE_TOPIC,
    delay_level_in,
    parse_delay_levels,
)
from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.jsonfile import read_offset_table, write_json
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    Prop,
    decode_message,
)
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetStatus
from tidemq.tasks import phase_of, sleep_until_tick, supervise, wait_event_until_tick
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)

#: The consumer group name the service reads its queues with (store statistics only).
SCHEDULE_GROUP = "SCHEDULE_CONSUMER"
DELAY_OFFSET_FILE = "delayOffset.json"

#: Messages read per look at a level's queue.
READ_BATCH = 256
#: How long an idle level waits for an arrival before looking again anyway.  The levels look on a
#: grid of this period, each at its own phase ((level - 1/2) / levels of it), not all at once: eighteen
#: levels looking together were one ~0.4 ms stretch of the event loop twice a second (issue 38).
IDLE_WAIT_S = 0.5
#: What :meth:`ScheduleMessageService._deliver_due` answers when nothing is stored past a level's
#: progress: the level sleeps until an arrival (or the confirm offset) sets its event, with no
#: timer (an idle broker's eighteen levels woke its loop 36 times a second before, session 13).
NOTHING_STORED = float("inf")
#: Back-off after the store refused a delivery.
RETRY_AFTER_FAILURE_S = 1.0
#: How often changed delay offsets are written.
PERSIST_INTERVAL_S = 1.0


def delay_level_of(msg: MessageInner | MessageExt) -> int:
    """The DELAY property as an int (0 when absent or not a number)."""
    return delay_level_in(msg.properties)


class ScheduleMessageService:
    """Swaps delayed messages into SCHEDULE_TOPIC_XXXX and delivers them when due."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.store = broker.store
        self.levels = parse_delay_levels(broker.settings.delay_levels)
        self.path: Path = broker.data_dir / "config" / DELAY_OFFSET_FILE
        #: level (1-based) -> next ConsumeQueue offset to deliver
        self.offsets: dict[int, int] = {}
        self.delivered = 0
        self._dirty = False
        #: Set when an offset changes: the persist loop sleeps on it while nothing changed.
        self._changed = asyncio.Event()
        self._events: list[asyncio.Event] = []
        #: Levels (queue ids) whose next message waits for the confirm offset (woken by it).
        self._held: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def max_level(self) -> int:
        return len(self.levels)

    # ------------------------------------------------------------------ put-side swap
    def rewrite(self, msg: MessageInner) -> bool:
        """Move a message with DELAY > 0 to its schedule queue (CommitLog.putMessage's swap).

        Prepared/rollback transaction records are never delayed; levels above the last one use
        the last.  Returns True when the message was swapped.
        """
        if msg.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            return False
        level = delay_level_of(msg)
        if level <= 0:
            return False
        if level > self.max_level:
            level = self.max_level
            msg.properties[Prop.DELAY_TIME_LEVEL] = str(level)
        msg.properties[Prop.REAL_TOPIC] = msg.topic
        msg.properties[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1
        return True

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        table = read_offset_table(self.path, "delay offsets")
        try:
            for level, offset in table.items():
                self.offsets[int(level)] = int(offset)
        except (TypeError, ValueError) as exc:
            raise CorruptDataError(
                f"{self.path} does not hold delay offsets ({exc}); restore it or move it away"
            ) from exc

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for arrivals in the schedule queues (call before the store starts)."""
        self._loop = loop
        self._events = [asyncio.Event() for _ in self.levels]
        self._changed = asyncio.Event()  # of this loop, as the levels' events
        if self._dirty:
            self._changed.set()
        listen_to_topic(self.store, self._on_arrival, SCHEDULE_TOPIC, _is_schedule_queue)
        bound = self.broker.read_bound
        if bound.active:
            bound.bind(loop, self._confirmed, lambda: bool(self._held))

    def start(self) -> None:
        """Start one delivery task per level (masters only: a slave takes no writes)."""
        if self._loop is None:
            self.attach(asyncio.get_running_loop())
        if not self.broker.is_master:
            return
        for level in range(1, self.max_level + 1):
            # A progress past the queue's end (this replica's log was cut back when it was
            # deposed, issue 25) would skip the messages written there from now on.
            top = self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, level - 1)
            if self.offsets.get(level, 0) > top:
                log.warning(
                    "delay level %d: progress %d past the queue's end %d, moved back",
                    level,
                    self.offsets[level],
                    top,
                )
                self._set_offset(level, top)
        for level in range(1, self.max_level + 1):
            self._tasks.append(
                supervise(functools.partial(self._run_level, level), f"tidemq-delay-level-{level}")
            )
        self._tasks.append(supervise(self._persist_loop, "tidemq-delay-offset-flush"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._held.clear()
        self.persist(force=True)

    def persist(self, force: bool = False) -> None:
        if not (self._dirty or force):
            return
        self._dirty = False
        write_json(self.path, self.serialize())

    def serialize(self) -> dict[str, Any]:
        return {"offsetTable": {str(level): off for level, off in sorted(self.offsets.items())}}

    # ------------------------------------------------------------------ requests
    async def get_all_delay_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET: the delayOffset.json content, for slaves to copy."""
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.serialize()))

    # ------------------------------------------------------------------ delivery
    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        # Store thread: only schedule-queue arrivals cross over to the event loop.
        if topic != SCHEDULE_TOPIC or self._loop is None or not 0 <= queue_id < len(self._events):
            return
        try:
            self._loop.call_soon_threadsafe(self._events[queue_id].set)
        except RuntimeError:
            pass  # the loop closed during shutdown

    def _confirmed(self) -> None:
        # The confirm offset grew while levels waited for it: they look again now.
        for queue_id in self._held:
            self._events[queue_id].set()

    def _set_offset(self, level: int, offset: int) -> None:
        if self.offsets.get(level) != offset:
            self.offsets[level] = offset
            self._dirty = True
            self._changed.set()

    async def _run_level(self, level: int) -> None:
        delay_ms = self.levels[level - 1]
        queue_id = level - 1
        event = self._events[queue_id]
        # Half a step off the grid's start: phase 0 is the whole second, when the stats take
        # their sample (and level 1 looked in the same loop turn, every second).
        phase = (level - 0.5) / self.max_level
        while True:
            try:
                event.clear()
                wait_s = await self._deliver_due(level, queue_id, delay_ms)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delay level %d: delivery failed", level)
                wait_s = RETRY_AFTER_FAILURE_S
            if wait_s is None:
                continue  # more may be due right now
            if wait_s == NOTHING_STORED:
                await event.wait()  # only an arrival (or the confirm offset) brings work
            elif wait_s == IDLE_WAIT_S:
                # Woken by an arrival (or the confirm offset), else at the level's next tick.
                await wait_event_until_tick(event, IDLE_WAIT_S, phase)
            else:
                await asyncio.sleep(wait_s)

    async def _deliver_due(self, level: int, queue_id: int, delay_ms: int) -> float | None:
        """Deliver the due head of one level; how long to wait before looking again (None: now)."""
        offset = self.offsets.get(level, 0)
        bound = self.broker.read_bound
        if not bound.active and offset == self.store.get_max_offset_in_queue(SCHEDULE_TOPIC, queue_id):
            # Idle: nothing stored past the progress (what the read below would find out, for the
            # price of a queue lookup instead of a read; a bounded read keeps the full path).
            return NOTHING_STORED
        # Up to the confirm offset only (controller SYNC masters): a message a failover can cut
        # is neither delivered nor passed, so the progress slaves copy never runs ahead of the
        # log a new master keeps; at the bound the answer is OFFSET_OVERFLOW_ONE (idle, re-polled).
        res = bound.get_message(SCHEDULE_GROUP, SCHEDULE_TOPIC, queue_id, offset, READ_BATCH)
        self._held.discard(queue_id)
        if res.status is not GetStatus.FOUND:
            if res.status is GetStatus.OFFSET_OVERFLOW_ONE and bound.holds(SCHEDULE_TOPIC, queue_id, offset):
                self._held.add(queue_id)  # stored, not yet confirmed: woken when it is
                return IDLE_WAIT_S
            if res.status is GetStatus.OFFSET_OVERFLOW_ONE:
                return NOTHING_STORED  # at the (confirmed) end: an arrival or the confirm wakes it
            if res.status in (
                GetStatus.OFFSET_TOO_SMALL,
                GetStatus.OFFSET_OVERFLOW_BADLY,
                GetStatus.OFFSET_FOUND_NULL,
            ):
                if res.next_begin_offset != offset:
                    log.warning(
                        "delay level %d: offset %d corrected to %d (%s)",
                        level,
                        offset,
                        res.next_begin_offset,
                        res.status.value,
                    )
                    self._set_offset(level, res.next_begin_offset)
                    return None
            if res.status is GetStatus.NO_MATCHED_MESSAGE and res.next_begin_offset > offset:
                self._set_offset(level, res.next_begin_offset)
                return None
            return IDLE_WAIT_S
        now = int(time.time() * 1000)
        due: list[tuple[int, MessageExt]] = []
        wait_ms = 0
        next_offset = offset
        for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
            try:
                ext = decode_message(buf)
            except CorruptDataError as exc:
                log.error(
                    "delay level %d: unreadable record at queue offset %d skipped: %s", level, qoff, exc
                )
                next_offset = qoff + 1
                continue
            deliver_at = ext.store_timestamp + delay_ms
            if deliver_at > now + delay_ms:
                deliver_at = now  # the clock went back: never wait longer than the level's delay
            if deliver_at > now:
                wait_ms = deliver_at - now
                break
            next_offset = qoff + 1
            if ext.properties.get(Prop.REAL_TOPIC, SCHEDULE_TOPIC) == SCHEDULE_TOPIC:
                # Written straight to the schedule topic, not by the swap: delivering it would loop.
                log.warning(
                    "delay level %d: message at queue offset %d has no real topic, dropped", level, qoff
                )
                continue
            due.append((qoff, ext))
        else:
            next_offset = max(next_offset, res.next_begin_offset)
        if due and not self.broker.is_master:
            return IDLE_WAIT_S  # demoted (issue 25): a slave writes nothing; the service is stopping
        if due:
            futures = [self.store.put_message(self._real_message(ext)) for _, ext in due]
            results = await asyncio.gather(*(resolved(f) for f in futures), return_exceptions=True)
            for (qoff, ext), result in zip(due, results, strict=True):
                if isinstance(result, BaseException) or not result.ok:
                    # Keep the failed one (and everything after it) for the next attempt.
                    log.warning(
                        "delay level %d: delivery of %s to %s failed: %s",
                        level,
                        ext.uniq_key or ext.msg_id,
                        ext.properties.get(Prop.REAL_TOPIC),
                        result if isinstance(result, BaseException) else result.status.value,
                    )
                    self._set_offset(level, qoff)
                    return RETRY_AFTER_FAILURE_S
                self.delivered += 1
                self.broker.stats.on_put(
                    ext.properties.get(Prop.REAL_TOPIC, ext.topic), 1, result.wrote_bytes
                )
        if next_offset != offset:
            self._set_offset(level, next_offset)
        if wait_ms:
            return wait_ms / 1000
        return None if next_offset != offset else IDLE_WAIT_S

    def _real_message(self, ext: MessageExt) -> MessageInner:
        """The message as its producer sent it: real topic and queue back, DELAY gone."""
        props = dict(ext.properties)
        props.pop(Prop.DELAY_TIME_LEVEL, None)
        topic = props.get(Prop.REAL_TOPIC) or ext.topic
        try:
            queue_id = int(props.get(Prop.REAL_QUEUE_ID, "0"))
        except ValueError:
            queue_id = 0
        return MessageInner(
            topic=topic,
            body=ext.body,
            queue_id=queue_id,
            flag=ext.flag,
            properties=props,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=self.broker.store_host,
            reconsume_times=ext.reconsume_times,
            prepared_transaction_offset=ext.prepared_transaction_offset,
        )

    async def _persist_loop(self) -> None:
        phase = phase_of("tidemq-delay-offset-flush")
        while True:
            await self._changed.wait()  # idle levels change nothing: no wake-up meanwhile
            await sleep_until_tick(PERSIST_INTERVAL_S, phase)  # not in step with the other loops
            self._changed.clear()
            if self._dirty:
                try:
                    await asyncio.to_thread(self.persist)
                except Exception:
                    log.exception("cannot persist %s", self.path)


def _is_schedule_queue(topic: str, queue_id: int) -> bool:
    """Arrival filter: only the delay levels' queues wake the schedule service."""
    return topic == SCHEDULE_TOPIC
