"""TimerSchedule: the on-disk schedule (the TimerLog and the wheel) and the progress through it.

The parts of the timer service share one :class:`TimerSchedule`: the put side reads its geometry,
the enqueue links records into it (:meth:`TimerSchedule.link`), recovery re-links what a crash cut
off (:meth:`TimerSchedule.relink`), the delivery walks it tick by tick, and the figures read its
counts.  No Python object is kept per scheduled message: the schedule is the two files; this
object holds only where the enqueue and the delivery are, and counters.
"""

from __future__ import annotations

import asyncio
import collections
import time

from tidemq.broker.timer.timer_log import NO_RECORD, TimerLog, TimerLogRecord
from tidemq.broker.timer.timer_wheel import TimerWheel


def now_ms() -> int:
    return int(time.time() * 1000)


class TimerSchedule:
    """The log, the wheel, the enqueue and delivery progress, and the figures of one broker."""

    def __init__(self, precision_ms: int, slots: int, max_delay_sec: int, roll_window_ms: int) -> None:
        self.precision_ms = precision_ms
        self.slots = slots
        self.max_delay_sec = max_delay_sec
        #: A message due later than this is rolled (0: never).
        self.roll_window_ms = roll_window_ms
        self.log: TimerLog | None = None
        self.wheel: TimerWheel | None = None
        #: rmq_sys_wheel_timer queue offset the enqueue reads next.
        self.queue_offset = 0
        #: Every tick before it is delivered; the tick being walked is ``done_tick`` meanwhile.
        self.done_tick = 0
        #: Records at or before this tick are delivered by the enqueue itself.
        self.claimed_tick = -1
        #: Recalls whose marker is not in the wheel yet: the next tick waits for them (a while).
        self.recalls_in_flight = 0
        #: Set by the enqueue when it puts a record in the wheel: the master's dequeue, idle (no
        #: record pending, nothing to enqueue), sleeps on it instead of walking empty ticks.
        self.dequeue_wake = asyncio.Event()
        #: The dequeue sleeps on ``dequeue_wake``: ``done_tick`` is behind the clock, with nothing due.
        self.dequeue_idle = False
        # Figures (runtime info, metrics).
        self.enqueued = 0
        self.delivered = 0
        self.refused = 0
        #: Records in the wheel whose tick is not delivered yet.
        self.pending = 0
        #: Real topic -> messages waiting in the wheel (RocketMQ's timermetrics ``timingCount``),
        #: kept in the checkpoint; approximate after a crash.  A slave counts too (as ``pending``):
        #: promoted, it delivers what it enqueued as a slave.
        self.timing: dict[str, int] = {}
        self.checkpoints_written = 0
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=64)
        #: Messages delivered again after a restart or a promotion that may have gone out before
        #: it (every duplicate is one of them): due before ``repeat_before_ms``.
        self.recovered_redeliveries = 0
        #: Ticks due before this may have been delivered before the restart or the promotion.
        self.repeat_before_ms = 0
        self.rolled = 0
        self.recalled = 0
        self.lateness_ms: list[int] = []  # last deliveries' lateness, bounded (metrics)

    def files(self) -> tuple[TimerLog, TimerWheel]:
        """The log and the wheel (opened by the load)."""
        assert self.log is not None and self.wheel is not None
        return self.log, self.wheel

    def skip_idle_ticks(self, now: int) -> None:
        """The master's dequeue slept with nothing pending (``dequeue_idle``): the ticks it slept
        through are empty, so it goes on from the clock's tick instead of walking each of them (a
        month asleep is ~2.6 million one-second ticks, seconds of the loop).  The enqueue calls
        this before it links new records: one due before the clock's tick is then delivered at
        once by the enqueue, as any record of a tick already walked."""
        tick = now // self.precision_ms
        if self.pending or self.recalls_in_flight or tick <= self.done_tick:
            return
        self.done_tick = tick
        self.claimed_tick = tick - 1

    def chain(self, tick: int) -> tuple[int, int, int, int]:
        """(prev_pos, first_pos, num, slot tick) a new record of ``tick`` joins its slot with: the
        slot's chain is kept while it may hold undelivered records, else started again."""
        slot = self.files()[1].get(tick)
        if slot is not None and slot.num and slot.tick >= self.done_tick:
            return slot.last_pos, slot.first_pos, slot.num, max(slot.tick, tick)
        return NO_RECORD, -1, 0, tick

    def link(self, rec_size: int, deliver_ms: int, phy: int, qoff: int, now: int) -> tuple[int, int, int]:
        """Append a record, then chain it into its slot (in that order: a crash between the two
        leaves a record recovery re-links); (its position, its tick, when the wheel acts on it).

        A message due beyond the roll window is chained at the window's end instead, where it is
        put back into rmq_sys_wheel_timer (RocketMQ's roll): its commit-log copy stays younger
        than the window, whatever the commit log's retention."""
        log, wheel = self.files()
        due_ms = min(deliver_ms, now + self.roll_window_ms) if self.roll_window_ms else deliver_ms
        tick = due_ms // self.precision_ms
        prev, first, num, slot_tick = self.chain(tick)
        pos = log.append(rec_size, prev, due_ms, deliver_ms, phy, qoff)
        wheel.put(slot_tick, first if num else pos, pos, num + 1)
        return pos, tick, due_ms

    def relink(self, rec: TimerLogRecord, tick: int) -> None:
        """Chain an existing record into its slot again (recovery, a rebuilt wheel)."""
        log, wheel = self.files()
        prev, first, num, slot_tick = self.chain(tick)
        log.set_prev(rec.pos, prev)
        wheel.put(slot_tick, first if num else rec.pos, rec.pos, num + 1)

    def count_pending(self) -> int:
        """Records in the wheel not yet delivered (reads every slot once, at load)."""
        return sum(num for tick_of, num in self.files()[1].ticks_and_counts() if tick_of >= self.done_tick)

    def count_ticks(self, first: int, end: int) -> int:
        """Records in the slots of ticks ``first`` .. ``end - 1`` (a slave skipping them)."""
        wheel = self.files()[1]
        total = 0
        for tick in range(first, min(end, first + self.slots)):
            slot = wheel.get(tick)
            if slot is not None and slot.num and slot.tick == tick:
                total += slot.num
        return total

    def count_in(self, topic: str) -> None:
        """One message of ``topic`` entered the wheel (the per-topic timing count)."""
        self.timing[topic] = self.timing.get(topic, 0) + 1

    def forget(self, topic: str, counted: bool) -> None:
        """One message of ``topic`` left the wheel (the per-topic timing count)."""
        if not counted:
            return
        left = self.timing.get(topic, 0) - 1
        if left > 0:
            self.timing[topic] = left
        else:
            self.timing.pop(topic, None)
