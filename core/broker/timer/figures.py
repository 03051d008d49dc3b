"""The timer's figures: runtime info and metrics under RocketMQ 5's names, and the scheduled
count per topic (RocketMQ's timermetrics ``timingCount``).

The counts live in the :class:`TimerSchedule`: the enqueue counts each message it links into the
wheel, on a slave as on a master (a promoted slave delivers them), and the delivery forgets each
one it delivers, or a slave's clock passes by (``TimerDelivery.pass_by``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.store import MessageStore


class ReadableEnd(Protocol):
    """Where a queue's readable messages end: the broker's
    :class:`~tidemq.broker.confirmed.ReadBound` (the confirm offset in controller mode)."""

    def max_offset(self, topic: str, queue_id: int) -> int: ...


class TimerFiguresOf:
    """Reads a schedule's figures (nothing here changes it)."""

    def __init__(
        self, schedule: TimerSchedule, store: MessageStore, readable: ReadableEnd | None = None
    ) -> None:
        self.schedule = schedule
        self.store = store
        #: The enqueue reads rmq_sys_wheel_timer through it (None: the store's end, no bound).
        self.readable = readable

    def backlog(self) -> int:
        """Messages parked and not yet delivered: in the wheel, or stored and not yet enqueued."""
        return self.schedule.pending + self.enqueue_behind()

    def enqueue_behind(self) -> int:
        """Messages in rmq_sys_wheel_timer the enqueue could read and has not put in the wheel yet
        (RocketMQ's timerOffsetBehind).

        Up to the confirm offset in controller mode: the enqueue reads no further, and RocketMQ 5's
        ``getEnqueueBehindMessages`` is the consume queue's max offset (dispatched only up to the
        confirm offset) minus the timer's read offset, so a message the in-sync set has not
        acknowledged is not counted behind until it is."""
        readable = self.readable
        end = (
            readable.max_offset(TIMER_TOPIC, 0)
            if readable is not None
            else self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
        )
        return max(0, end - self.schedule.queue_offset)

    def dequeue_behind_ms(self) -> int:
        """How far the delivery lags the clock (0 when it keeps up; RocketMQ's timerReadBehind in ms)."""
        s = self.schedule
        if s.dequeue_idle:
            return 0  # nothing pending: the ticks it has not walked are empty
        return max(0, now_ms() - (s.done_tick + 1) * s.precision_ms)

    def sample(self) -> None:
        """Note the counters (each checkpoint), for :meth:`tps`."""
        s = self.schedule
        s.samples.append((time.monotonic(), s.enqueued, s.delivered))

    def tps(self) -> tuple[float, float]:
        """(enqueued, delivered) per second over the last ~10 s of checkpoints."""
        samples = self.schedule.samples
        if len(samples) < 2:
            return 0.0, 0.0
        t1, e1, d1 = samples[-1]
        t0, e0, d0 = next(s for s in samples if t1 - s[0] <= 10.0)
        span = t1 - t0
        return ((e1 - e0) / span, (d1 - d0) / span) if span > 0 else (0.0, 0.0)

    def runtime_info(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's timer keys, with RocketMQ 5's names."""
        enq, deq = self.tps()
        return {
            "timerReadBehind": str(self.dequeue_behind_ms() // 1000),
            "timerOffsetBehind": str(self.enqueue_behind()),
            "timerCongestNum": str(self.schedule.pending),
            "timerEnqueueTps": f"{enq:.2f}",
            "timerDequeueTps": f"{deq:.2f}",
            # tidemq's: messages due before a crash delivered again by the recovery (at least once:
            # each duplicate a crash causes is one of them).
            "timerRecoveredRedeliveries": str(self.schedule.recovered_redeliveries),
        }

    def metric_values(self) -> dict[str, Any]:
        """Figures for Prometheus, under RocketMQ 5's timer metric names (tidemq_ for its own)."""
        s = self.schedule
        late = sorted(s.lateness_ms)
        return {
            "rocketmq_timer_enqueue_lag": self.enqueue_behind(),
            "rocketmq_timer_dequeue_latency": self.dequeue_behind_ms(),
            "rocketmq_timer_enqueue_total": s.enqueued,
            "rocketmq_timer_dequeue_total": s.delivered,
            "tidemq_timer_recovered_redeliveries_total": s.recovered_redeliveries,
            "rocketmq_timing_messages": dict(s.timing),
            "tidemq_timer_lateness_p99_ms": late[min(len(late) - 1, len(late) * 99 // 100)] if late else 0,
        }
