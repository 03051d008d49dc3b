"""The enqueue: ``rmq_sys_wheel_timer`` read in order into the schedule.

One task reads rmq_sys_wheel_timer queue 0 and appends one 48-byte record per message to the
TimerLog, chained into the slot of its tick (``deliver_ms // timerPrecisionMs``) of the wheel
(:meth:`~tidemq.broker.timer.schedule.TimerSchedule.link`).  A message whose tick is already being
(or was) delivered is delivered at once, by the enqueue itself.  The enqueue tracks the point up to
which every record is settled (logged, and delivered when it was due at once): the checkpoint
claims no more than that.

It reads through the broker's :class:`~tidemq.broker.confirmed.ReadBound` (on a master and on a
slave alike): in controller mode nothing past the confirm offset is linked, so no TimerLog record
ever names a message a failover cuts (the commit-log offset it names would hold another message
after the truncation), and the queue offset the checkpoint keeps never passes the cut.  Held at
the bound, it is woken by the acknowledgement.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from tidemq.arrival import listen_to_topic
from tidemq.broker.timer.delivery import IDLE_WAIT_S, RETRY_AFTER_FAILURE_S, TimerDelivery
from tidemq.broker.timer.properties import TIMER_OUT_MS, TIMER_TOPIC
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.broker.timer.timer_log import NO_RECORD, TimerLogRecord
from tidemq.errors import CorruptDataError
from tidemq.message import Prop, decode_message
from tidemq.store import GetStatus
from tidemq.tasks import phase_of, wait_event_until_tick

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: The consumer group the enqueue reads rmq_sys_wheel_timer with (store statistics only).
TIMER_GROUP = "TIMER_CONSUMER"
READ_BATCH = 256


class TimerEnqueue:
    """Reads rmq_sys_wheel_timer into the schedule; delivers at once what is already due."""

    def __init__(self, broker: BrokerContext, schedule: TimerSchedule, delivery: TimerDelivery) -> None:
        self.broker = broker
        self.store = broker.store
        self.schedule = schedule
        self.delivery = delivery
        #: Records due before a crash, delivered again first (at least once).
        self.recovered: list[TimerLogRecord] = []
        #: (log position, queue offset) with every record before them settled.
        self.settled = (0, 0)
        #: (log end, queue offset, direct deliveries in flight) per enqueued batch, in log order:
        #: the settled point moves past a batch once its deliveries are done.
        self._unsettled: collections.deque[tuple[int, int, asyncio.Future[None] | None]] = collections.deque()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The next record is stored but waits for the confirm offset (woken by it).
        self._held = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for arrivals in rmq_sys_wheel_timer (call before the store starts)."""
        self._loop = loop
        self._event = asyncio.Event()
        listen_to_topic(self.store, self._on_arrival, TIMER_TOPIC, _is_timer_queue)
        bound = self.broker.read_bound
        if bound.active:
            bound.bind(loop, self._event.set, lambda: self._held)

    @property
    def attached(self) -> bool:
        return self._loop is not None

    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        if topic != TIMER_TOPIC or self._loop is None or self._event is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            pass  # the loop closed during shutdown

    async def loop(self) -> None:
        assert self._event is not None
        event = self._event
        phase = phase_of("tidemq-timer-enqueue")
        if self.recovered:
            recs, self.recovered = self.recovered, []
            n = await self.delivery.deliver_records(recs)
            self.schedule.recovered_redeliveries += n
            if n:
                log.warning("timer: %d messages due before the crash delivered again (at least once)", n)
        while True:
            event.clear()
            try:
                more = await self.enqueue_some()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer enqueue failed")
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            if (
                not more
                and not self._held
                and self.schedule.queue_offset >= self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
            ):
                # Nothing stored past the progress: only an arrival brings work (no timer: an idle
                # broker's enqueue woke its loop twice a second before, session 13).
                await event.wait()
            elif not more:
                # Woken by an arrival (or the confirm offset), else at its next tick: on the grid
                # at its own phase, not in step with the delay levels and the other timer loops.
                await wait_event_until_tick(event, IDLE_WAIT_S, phase)

    async def enqueue_some(self) -> bool:
        """Enqueue one batch of rmq_sys_wheel_timer; whether there may be more right now."""
        s = self.schedule
        offset = s.queue_offset
        bound = self.broker.read_bound
        res = bound.get_message(TIMER_GROUP, TIMER_TOPIC, 0, offset, READ_BATCH)
        self._held = False
        if res.status is not GetStatus.FOUND:
            if res.status is GetStatus.OFFSET_OVERFLOW_ONE and bound.holds(TIMER_TOPIC, 0, offset):
                self._held = True  # stored, not yet confirmed: woken when it is
                return False
            if res.next_begin_offset != offset and res.status in (
                GetStatus.OFFSET_TOO_SMALL,
                GetStatus.OFFSET_OVERFLOW_BADLY,
                GetStatus.OFFSET_FOUND_NULL,
                GetStatus.NO_MATCHED_MESSAGE,
            ):
                log.warning(
                    "timer: queue offset %d corrected to %d (%s)",
                    offset,
                    res.next_begin_offset,
                    res.status.value,
                )
                s.queue_offset = res.next_begin_offset
                self.settled = (self.settled[0], s.queue_offset)
                return True
            return False
        direct: list[TimerLogRecord] = []
        log_ = s.files()[0]
        now = now_ms()
        master = self.broker.is_master
        if master and s.dequeue_idle:
            s.skip_idle_ticks(now)
        for buf, qoff in zip(res.buffers, res.queue_offsets, strict=True):
            try:
                ext = decode_message(buf)
                deliver = int(ext.properties[TIMER_OUT_MS])
            except (CorruptDataError, KeyError, ValueError) as exc:
                log.error("timer: record at queue offset %d skipped: %s", qoff, exc)
                continue
            if ext.properties.get(Prop.REAL_TOPIC, TIMER_TOPIC) == TIMER_TOPIC:
                log.warning("timer: message at queue offset %d has no real topic, dropped", qoff)
                continue
            pos, tick, due = s.link(ext.store_size, deliver, ext.commit_log_offset, qoff, now)
            s.enqueued += 1
            if tick <= s.claimed_tick and master:  # its tick is being or was walked: delivered here
                direct.append(
                    TimerLogRecord(pos, ext.store_size, NO_RECORD, due, deliver, ext.commit_log_offset, qoff)
                )
            elif tick > s.claimed_tick:
                s.pending += 1
                s.dequeue_wake.set()  # an idle dequeue walks the ticks again
                # Counted on a slave too, as pending is: promoted, it delivers these (and a slave
                # forgets those its clock passes by, TimerDelivery.pass_by).
                s.count_in(ext.properties[Prop.REAL_TOPIC])
        s.queue_offset = max(offset, res.next_begin_offset, res.queue_offsets[-1] + 1)
        delivering = asyncio.ensure_future(self.delivery.deliver_direct(direct)) if direct else None
        self._unsettled.append((log_.end, s.queue_offset, delivering))
        self.settle()
        return True

    def settle(self) -> tuple[int, int]:
        """Move the settled point past the batches whose direct deliveries are done; returns it."""
        while self._unsettled:
            pos, qoff, delivering = self._unsettled[0]
            if delivering is not None and not delivering.done():
                break
            self._unsettled.popleft()
            self.settled = (pos, qoff)
        return self.settled

    async def cancel_direct(self) -> None:
        """Stop the direct deliveries still running; they stay unsettled (delivered again after
        the restart)."""
        running = [f for _, _, f in self._unsettled if f is not None and not f.done()]
        for f in running:
            f.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self._unsettled.clear()


def _is_timer_queue(topic: str, queue_id: int) -> bool:
    return topic == TIMER_TOPIC
