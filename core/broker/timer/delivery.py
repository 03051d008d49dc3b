"""The delivery: due messages put to their real topic, tick by tick.

When tick ``T`` has fully passed (``now >= (T + 1) * precision``) the dequeue task walks T's slot
back from its last record, reads each due message from the commit log by offset and puts it to its
real topic with its own body, keys, tags, properties and UNIQ_KEY (the consumer sees the
producer's message id), ``TIMER_OUT_MS`` kept.  A message is never delivered before its time and at
most ``timerPrecisionMs`` (plus the put) after it.  A recall's delete marker cancels the message of
its tick it names; a rolled message goes back into ``rmq_sys_wheel_timer`` for another turn.

On a slave the dequeue delivers nothing: it follows the clock :data:`SLAVE_BEHIND_MS` behind, so
that a slave promoted by a failover delivers what was due in that window again (the old master may
not have) and everything due after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from tidemq.broker.timer.properties import TIMER_DEL_UNIQKEY, TIMER_TOPIC
from tidemq.broker.timer.recall import delete_key
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.broker.timer.timer_log import NO_RECORD, TimerLogRecord
from tidemq.broker.timer.trace import TimerTrace
from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.message import MessageExt, MessageInner, Prop, decode_message
from tidemq.store import PutResult
from tidemq.tasks import phase_of, sleep_until_tick
from tidemq.trace.format import TraceContext

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5
RETRY_AFTER_FAILURE_S = 1.0
#: A slave's dequeue follows the clock this far behind: promoted by a failover, it delivers again
#: what was due in this window before (the dead master may not have), so failovers faster than this
#: lose nothing, and the duplicates they cause are the messages due in it.
SLAVE_BEHIND_MS = 30_000
#: Puts in flight at once while a tick is delivered.
DELIVER_WINDOW = 512


class TimerDelivery:
    """Walks the wheel's ticks as they pass and puts their messages to their real topics."""

    def __init__(self, broker: BrokerContext, schedule: TimerSchedule) -> None:
        self.broker = broker
        self.store = broker.store
        self.schedule = schedule
        #: The delivery's trace records (with ``trace_topic_enable``).
        self.trace = TimerTrace(broker)
        #: Awaited before each window of puts: the checkpoint's mtime made recent enough for
        #: recovery to count these deliveries if they are repeated after a crash
        #: (:meth:`TimerMessageStore._mark_current`).
        self.before_put: Callable[[], Awaitable[None]] | None = None

    async def dequeue_loop(self) -> None:
        s = self.schedule
        walked = 0
        lagging = 0
        stored = 0
        slave_phase = phase_of("tidemq-timer-dequeue")
        while True:
            tick = s.done_tick
            wait_ms = tick * s.precision_ms - now_ms()
            if self.broker.is_master and self._idle():
                # Nothing pending in the wheel, nothing stored to enqueue: no tick has anything to
                # deliver until the enqueue puts a record in (it sets dequeue_wake).  Before
                # (session 13) the loop woke every tick to walk an empty slot.  Woken, it walks
                # the ticks it slept through (empty but for the new records) as after a downtime.
                s.dequeue_idle = True
                try:
                    await s.dequeue_wake.wait()
                finally:
                    s.dequeue_idle = False
                continue
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
                continue
            walked += 1
            if walked % 1024 == 0:
                await asyncio.sleep(0)  # catching up after a downtime: let the loop breathe
            if not self.broker.is_master:  # a slave: follow the clock, deliver nothing
                behind = (now_ms() - SLAVE_BEHIND_MS) // s.precision_ms
                if behind > s.done_tick:
                    self.pass_by(behind)
                await sleep_until_tick(max(s.precision_ms / 1000, IDLE_WAIT_S), slave_phase)
                continue
            if lagging == 0:
                # Confirmed only: the enqueue does not read past the confirm offset (controller).
                stored = self.broker.read_bound.max_offset(TIMER_TOPIC, 0)
            if (s.queue_offset < stored or s.recalls_in_flight) and lagging < s.precision_ms // 10:
                # Stored before the tick began but not yet in the wheel: wait (up to one tick) so
                # that it is walked with the tick (a recall's marker above all).
                lagging += 1
                await asyncio.sleep(0.01)
                continue
            lagging = 0
            s.claimed_tick = tick
            try:
                records = self.due_records(tick)
                if records:
                    await self.deliver_records(records, strict=True, counted=True)
                    s.pending = max(0, s.pending - len(records))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer: delivery of tick %d failed, retried", tick)
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            s.done_tick = tick + 1

    def _idle(self) -> bool:
        """No record pending and nothing stored to enqueue (clears ``dequeue_wake`` first, so
        that a record put in after this look wakes the wait that follows)."""
        s = self.schedule
        s.dequeue_wake.clear()
        if s.pending or s.recalls_in_flight:
            return False
        return s.queue_offset >= self.broker.read_bound.max_offset(TIMER_TOPIC, 0)

    def pass_by(self, tick: int) -> None:
        """A slave's clock moves on to ``tick`` without delivering: the records of the ticks passed
        leave the figures (the master delivered them), per topic as :meth:`deliver_records` does."""
        s = self.schedule
        first = s.done_tick
        if tick <= first:
            return
        s.pending = max(0, s.pending - s.count_ticks(first, tick))
        if s.timing:
            for t in range(first, min(tick, first + s.slots)):  # as count_ticks: one turn of the wheel
                for rec in self.due_records(t):
                    ext = self._read(rec)
                    if ext is not None:
                        s.forget(ext.properties.get(Prop.REAL_TOPIC, ""), True)
        s.done_tick = tick
        s.claimed_tick = tick - 1

    def due_records(self, tick: int) -> list[TimerLogRecord]:
        """The records of ``tick``'s slot, in log order."""
        log_, wheel = self.schedule.files()
        slot = wheel.get(tick)
        if slot is None or not slot.num:
            return []
        out: list[TimerLogRecord] = []
        pos = slot.last_pos
        seen = 0
        while pos != NO_RECORD and seen < slot.num:
            rec = log_.read(pos)
            if rec is None:
                if pos >= log_.start:  # below it: a deleted file, whose records all went out
                    log.error(
                        "timer: slot of tick %d points at %d, not a record; rest of the slot skipped",
                        tick,
                        pos,
                    )
                break
            seen += 1
            if rec.due_ms // self.schedule.precision_ms == tick:
                out.append(rec)
            pos = rec.prev_pos
        out.reverse()  # log order: a producer's order among messages due in one tick
        return out

    async def deliver_direct(self, records: list[TimerLogRecord]) -> None:
        """Records of a tick being or already walked: each at its time, retried until stored."""
        while True:
            try:
                await self.deliver_records(records, strict=True)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer: direct delivery failed, retried")
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)

    async def deliver_records(
        self, records: list[TimerLogRecord], strict: bool = False, counted: bool = False
    ) -> int:
        """Put each record's message to its real topic; how many went.  ``strict``: a failed put
        raises (the tick is retried whole: at least once)."""
        s = self.schedule
        delivered = 0
        # Read them all first: a recall's delete marker cancels a message of the same tick.
        loaded: list[tuple[TimerLogRecord, MessageExt]] = []
        deleted: set[str] = set()
        for rec in sorted(records, key=lambda r: (r.due_ms, r.pos)):
            ext = self._read(rec)
            if ext is None:
                continue
            loaded.append((rec, ext))
            key = ext.properties.get(TIMER_DEL_UNIQKEY)
            if key is not None and rec.deliver_ms <= rec.due_ms:
                deleted.add(key)
        start = 0
        while start < len(loaded):
            # Never before its time: wait for the next one, then take every one due by now.
            wait_ms = loaded[start][0].due_ms - now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            now = now_ms()
            end = start
            while end < len(loaded) and end - start < DELIVER_WINDOW and loaded[end][0].due_ms <= now:
                end += 1
            window = loaded[start:end]
            start = end
            msgs: list[tuple[TimerLogRecord, MessageInner]] = []
            for rec, ext in window:
                if rec.deliver_ms > rec.due_ms:  # rolled: back into the wheel topic, a fresh copy
                    msgs.append((rec, self._rolled_message(ext)))
                    continue
                props = ext.properties
                if TIMER_DEL_UNIQKEY in props:  # a recall's marker: never delivered itself
                    s.forget(props.get(Prop.REAL_TOPIC, ""), counted)
                    continue
                if deleted and delete_key(props.get(Prop.REAL_TOPIC, ""), ext.uniq_key or "") in deleted:
                    s.recalled += 1
                    s.forget(props.get(Prop.REAL_TOPIC, ""), counted)
                    continue
                msgs.append((rec, self._real_message(ext)))
            if msgs and self.before_put is not None:
                await self.before_put()
            results = await _outcomes([self.store.put_message(m) for _, m in msgs])
            now = now_ms()
            failed = None
            traced: list[TraceContext] = []
            for (rec, msg), result in zip(msgs, results, strict=True):
                if isinstance(result, BaseException) or not result.ok:
                    failed = result
                    log.warning(
                        "timer: delivery of %s to %s failed: %s",
                        msg.properties.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
                        msg.topic,
                        result if isinstance(result, BaseException) else result.status.value,
                    )
                    continue
                delivered += 1
                s.forget(msg.properties.get(Prop.REAL_TOPIC, msg.topic), counted)
                if msg.topic == TIMER_TOPIC:
                    s.rolled += 1
                    continue
                s.delivered += 1
                if counted and rec.deliver_ms < s.repeat_before_ms:
                    s.recovered_redeliveries += 1  # may have gone out before a restart or promotion
                self.broker.stats.on_put(msg.topic, 1, result.wrote_bytes)
                lateness = now - rec.deliver_ms
                if len(s.lateness_ms) >= 4096:
                    del s.lateness_ms[:2048]
                s.lateness_ms.append(lateness)
                if self.trace.enabled:
                    ctx = self.trace.record(msg, result, rec.deliver_ms)
                    if ctx is not None:
                        traced.append(ctx)
            if traced:
                await self.trace.write(traced)
            if failed is not None and strict:
                raise RuntimeError(f"a timer delivery failed: {failed}")
        return delivered

    def _read(self, rec: TimerLogRecord) -> MessageExt | None:
        raw = self.store.look_message_by_offset(rec.phy_offset, rec.size)
        if raw is None:
            log.error("timer: message at commit-log offset %d is gone (cleaned up?), skipped", rec.phy_offset)
            return None
        try:
            return decode_message(raw)
        except CorruptDataError as exc:
            log.error("timer: message at commit-log offset %d unreadable, skipped: %s", rec.phy_offset, exc)
            return None

    def _rolled_message(self, ext: MessageExt) -> MessageInner:
        """The parked message again, as it is, for another turn of the wheel."""
        return MessageInner(
            topic=TIMER_TOPIC,
            body=ext.body,
            queue_id=0,
            flag=ext.flag,
            properties=dict(ext.properties),
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=self.broker.store_host,
            reconsume_times=ext.reconsume_times,
            prepared_transaction_offset=ext.prepared_transaction_offset,
        )

    def _real_message(self, ext: MessageExt) -> MessageInner:
        """The message as its producer sent it, to its real topic and queue, TIMER_OUT_MS kept."""
        props = dict(ext.properties)
        topic = props.pop(Prop.REAL_TOPIC, ext.topic)
        try:
            queue_id = int(props.pop(Prop.REAL_QUEUE_ID, "0"))
        except ValueError:
            queue_id = 0
        props.pop(TIMER_DEL_UNIQKEY, None)
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


async def _outcomes(futures: list[Future[PutResult]]) -> list[PutResult | Exception]:
    """Each put's result or error, in order.  Most are done already (an async flush): read at once,
    not one task per put as ``asyncio.gather`` would make (a tick of 10 000 made 10 000 tasks)."""
    out: list[PutResult | Exception] = []
    for f in futures:
        try:
            result = f.result() if f.done() else await resolved(f)
        except Exception as exc:
            out.append(exc)
            continue
        out.append(result)
    return out
