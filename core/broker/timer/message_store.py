"""TimerMessageStore: messages due at any time (RocketMQ 5's timer), parked on disk until due.

The service is made of parts, one module each:

* :mod:`~tidemq.broker.timer.parking`: the put side, a timer message swapped to
  ``rmq_sys_wheel_timer`` by the send paths;
* :mod:`~tidemq.broker.timer.schedule`: the on-disk schedule (the
  :class:`~tidemq.broker.timer.timer_log.TimerLog` and the
  :class:`~tidemq.broker.timer.timer_wheel.TimerWheel`) and the progress through it;
* :mod:`~tidemq.broker.timer.enqueue`: rmq_sys_wheel_timer read in order into the schedule;
* :mod:`~tidemq.broker.timer.delivery`: each tick's messages put to their real topic once the tick
  has passed, recalls and rolls applied;
* :mod:`~tidemq.broker.timer.recovery`: the load after a restart or a crash;
* :mod:`~tidemq.broker.timer.figures` and :mod:`~tidemq.broker.timer.requests`: what operators
  read (runtime info, metrics, GET_TIMER_CHECK_POINT, GET_TIMER_METRICS) and RECALL_MESSAGE.

This module builds them and runs the lifecycle: load, start (the enqueue, dequeue and checkpoint
tasks), the checkpoint, stop.

Crash safety (SIGKILL at any moment): every TimerLog record carries its rmq_sys_wheel_timer
offset, and :class:`~tidemq.broker.timer.checkpoint.TimerCheckpoint` keeps (ticks delivered, log
position settled, queue offset enqueued), written every ``timer_flush_interval_ms`` after the log
and the wheel are flushed (what they wrote since the last time), unless nothing but the read time
changed (:class:`~tidemq.broker.timer.checkpoint.CheckpointWriter`).  Recovery re-links log records written after the checkpoint whose slot
update was lost, re-delivers those of them already due, continues the enqueue after the highest
queue offset found in the log, and the dequeue from the checkpoint's tick.  Delivery is therefore
at least once; the duplicates after a crash are at most the messages delivered in the last
``timer_flush_interval_ms + timerPrecisionMs`` before it (counted in ``recovered_redeliveries``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidemq.broker.timer import recovery
from tidemq.broker.timer.checkpoint import CheckpointWriter, TimerCheckpoint
from tidemq.broker.timer.delivery import SLAVE_BEHIND_MS, TimerDelivery
from tidemq.broker.timer.enqueue import TimerEnqueue
from tidemq.broker.timer.figures import TimerFiguresOf
from tidemq.broker.timer.parking import TimerParking
from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.broker.timer.requests import TimerRequests
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.errors import ConfigError
from tidemq.message import MessageInner
from tidemq.remoting.command import RemotingCommand
from tidemq.tasks import phase_of, sleep_until_tick, supervise

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: 32 bytes each: 1 GiB of wheel at most (3 days at 1 s is 518 402 slots, 16 MiB).
MAX_SLOTS = 1 << 25


class TimerMessageStore:
    """The timer service of one broker: put-side rewrite, enqueue, dequeue, checkpoint."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.store = broker.store
        s: Any = broker.settings
        self.enabled: bool = s.timer_wheel_enable
        self.precision_ms: int = s.timer_precision_ms
        self.max_delay_sec: int = s.timer_max_delay_sec
        self.flush_interval_s: float = s.timer_flush_interval_ms / 1000
        # Twice the longest delay in ticks: a slot is reused only long after its tick was delivered.
        self.slots = -(-2 * self.max_delay_sec * 1000 // self.precision_ms) + 2
        if self.slots > MAX_SLOTS:
            raise ConfigError(
                f"[broker] timer_max_delay_sec {self.max_delay_sec} / timer_precision_ms {self.precision_ms}: "
                f"the timer wheel would need {self.slots} slots (at most {MAX_SLOTS}); raise the precision"
            )
        data_dir = broker.data_dir
        self.log_dir = data_dir / "timerlog"
        self.wheel_path = data_dir / "timerwheel"
        self.checkpoint_path = data_dir / "config" / "timercheck"
        self.writer = CheckpointWriter(self.checkpoint_path)
        self.schedule = TimerSchedule(
            self.precision_ms, self.slots, self.max_delay_sec, s.timer_roll_window_slots * self.precision_ms
        )
        self.parking = TimerParking(self.schedule, self.enabled, s.name)
        self.delivery = TimerDelivery(broker, self.schedule)
        self.delivery.before_put = self._mark_current
        self.enqueue = TimerEnqueue(broker, self.schedule, self.delivery)
        self.figures = TimerFiguresOf(self.schedule, self.store, broker.read_bound)
        self.requests = TimerRequests(broker, self.schedule, self.parking, self._checkpoint_if_loaded)
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ put side
    def rewrite(self, msg: MessageInner, strict: bool = True) -> bool:
        """Park ``msg`` when a timer asks for a later delivery (:meth:`TimerParking.rewrite`)."""
        return self.parking.rewrite(msg, strict)

    def rewrite_batch(self, msgs: Sequence[MessageInner]) -> bool:
        """Park a batch with a timer on any message (:meth:`TimerParking.rewrite_batch`)."""
        return self.parking.rewrite_batch(msgs)

    def recall_handle(self, msg: MessageInner) -> str | None:
        """The recall handle of a parked message (None without a unique key)."""
        return self.parking.recall_handle(msg)

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Open the files and recover from the checkpoint (before the store starts)."""
        self.enqueue.recovered = recovery.load(
            self.schedule,
            self.log_dir,
            self.wheel_path,
            self.checkpoint_path,
            int(self.flush_interval_s * 1000),
        )
        log_ = self.schedule.files()[0]
        self.enqueue.settled = (log_.end, self.schedule.queue_offset)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for arrivals in rmq_sys_wheel_timer (call before the store starts)."""
        self.enqueue.attach(loop)

    def start(self) -> None:
        """Start the enqueue, dequeue and checkpoint tasks.

        On a slave the enqueue builds its own log and wheel from the replicated
        rmq_sys_wheel_timer and the dequeue delivers nothing: it follows the clock
        ``SLAVE_BEHIND_MS`` behind, so that a slave promoted by a failover delivers what was due
        in that window again (the old master may not have) and everything due after it.
        """
        if not self.enqueue.attached:
            self.attach(asyncio.get_running_loop())
        s = self.schedule
        if self._tasks or s.log is None:
            return
        if self._stopped:  # started again in this process (a role change)
            self._stopped = False
            self.enqueue.recovered.extend(recovery.recover_tail(s, self.enqueue.settled[0]))
            # What a slave's clock would have passed by: out of the figures, per topic too.
            self.delivery.pass_by((now_ms() - SLAVE_BEHIND_MS) // s.precision_ms)
            s.repeat_before_ms = now_ms()  # the window walked again may have gone out from the old master
            s.claimed_tick = s.done_tick - 1
            top = self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
            if s.queue_offset > top:  # this replica's log was cut back when it was deposed
                log.warning("timer: queue offset %d past the queue's end %d, moved back", s.queue_offset, top)
                s.queue_offset = top
        self._tasks.append(supervise(self.enqueue.loop, "tidemq-timer-enqueue"))
        self._tasks.append(supervise(self.delivery.dequeue_loop, "tidemq-timer-dequeue"))
        self._tasks.append(supervise(self._checkpoint_loop, "tidemq-timer-checkpoint"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        # Direct deliveries still running stay unsettled: delivered again after the restart.
        await self.enqueue.cancel_direct()
        self._stopped = True
        if self.schedule.log is not None:
            try:
                self.persist()
            except OSError as exc:
                log.error("cannot write %s: %s", self.checkpoint_path, exc)

    def close(self) -> None:
        s = self.schedule
        if s.log is not None:
            s.log.close()
        if s.wheel is not None:
            s.wheel.close()

    # ------------------------------------------------------------------ checkpoint
    def checkpoint(self) -> TimerCheckpoint:
        """Where the service is: the checkpoint it would write now."""
        s = self.schedule
        pos, qoff = self.enqueue.settle()
        return TimerCheckpoint(
            s.done_tick * s.precision_ms, pos, qoff, s.precision_ms, s.slots, dict(s.timing)
        )

    def _checkpoint_if_loaded(self) -> TimerCheckpoint | None:
        return self.checkpoint() if self.schedule.log is not None else None

    def persist(self) -> None:
        """Flush the log and the wheel, then write the checkpoint (in that order: it claims them)."""
        log_, wheel = self.schedule.files()
        cp = self.checkpoint()
        log_.flush()
        wheel.flush()
        self.writer.save(cp, self.schedule.pending)
        self.schedule.checkpoints_written += 1

    def _trim(self, cp: TimerCheckpoint) -> None:
        """Delete the log files all of whose records were delivered: settled before the checkpoint
        and written longer ago than any record's wait in the wheel (the roll window, or the
        longest delay without rolls)."""
        s = self.schedule
        horizon_ms = s.roll_window_ms or self.max_delay_sec * 1000
        older_than_s = (cp.last_read_time_ms - horizon_ms - 2 * self.precision_ms) / 1000
        deleted = s.files()[0].delete_before(cp.last_timer_log_flush_pos, older_than_s)
        if deleted:
            log.info("timer: %d delivered timer log file(s) deleted", deleted)

    async def _mark_current(self) -> None:
        """Before a delivery: the checkpoint's mtime no older than half an interval.  Recovery
        counts as possible repeats the deliveries due before that mtime + one interval + one tick
        (:func:`~tidemq.broker.timer.recovery.load`); a write or a touch every interval keeps it
        so while the service works or holds messages, but idle it is neither (no syscall for an
        idle broker), and messages that come then and are due within the interval would go out
        while the mtime is the idle stretch's start: repeated after a SIGKILL, not counted."""
        if self.writer.stale(self.flush_interval_s / 2):
            await asyncio.to_thread(self.writer.touch)

    async def _checkpoint_loop(self) -> None:
        # On the grid at its own phase (tidemq.tasks.until_tick): out of the other loops' way, and
        # a pass every interval (a sleep of one interval after each pass drifted by the pass).
        phase = phase_of("tidemq-timer-checkpoint")
        while True:
            await sleep_until_tick(self.flush_interval_s, phase)
            try:
                cp = self.checkpoint()
                waiting = self.schedule.pending
                if self.writer.needed(cp, waiting):  # not while unchanged: nothing new to make durable
                    log_, wheel = self.schedule.files()
                    await asyncio.to_thread(log_.flush)
                    pages = wheel.take_dirty()  # here, where the puts are: none missed
                    try:
                        await asyncio.to_thread(wheel.sync, pages)
                    except BaseException:
                        wheel.mark_dirty(pages)
                        raise
                    await asyncio.to_thread(self.writer.save, cp, waiting)
                    self.schedule.checkpoints_written += 1
                elif waiting:  # holding: the file stays, its mtime says it is current
                    await asyncio.to_thread(self.writer.touch)
                self._trim(cp)
                self.figures.sample()
            except Exception:
                log.exception("cannot persist %s", self.checkpoint_path)

    # ------------------------------------------------------------------ figures and requests
    def runtime_info(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's timer keys, with RocketMQ 5's names."""
        return self.figures.runtime_info()

    def metric_values(self) -> dict[str, Any]:
        """Figures for Prometheus, under RocketMQ 5's timer metric names (tidemq_ for its own)."""
        return self.figures.metric_values()

    async def get_timer_check_point(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_CHECK_POINT (60)."""
        return await self.requests.get_timer_check_point(conn, request)

    async def get_timer_metrics(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_METRICS (61)."""
        return await self.requests.get_timer_metrics(conn, request)

    async def recall_message(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """RECALL_MESSAGE (370, RocketMQ 5.5)."""
        return await self.requests.recall_message(conn, request)
