"""TimerMessageStore: messages due at any time (RocketMQ 5's timer), parked on disk until due.

Put side (:meth:`TimerMessageStore.rewrite`, called by the send paths after the send hooks): a
message with ``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC`` or ``TIMER_DELAY_MS`` is checked, gets
``TIMER_OUT_MS`` (when it is due), ``REAL_TOPIC`` and ``REAL_QID``, and is stored in
``rmq_sys_wheel_timer`` queue 0 like any message (so it is acknowledged only once stored, and
replicated and queryable by key as any message is).

Enqueue (a task): reads rmq_sys_wheel_timer queue 0 in order and appends one 48-byte record per
message to the :class:`~tidemq.broker.timer.timer_log.TimerLog`, chained into the slot of its tick
(``deliver_ms // timerPrecisionMs``) of the :class:`~tidemq.broker.timer.timer_wheel.TimerWheel`.
A message whose tick is already being (or was) delivered is delivered at once by the enqueue.

Dequeue (a task): when tick ``T`` has fully passed (``now >= (T + 1) * precision``) it walks T's
slot back from its last record, reads each due message from the commit log by offset and puts it
to its real topic with its own body, keys, tags, properties and UNIQ_KEY (the consumer sees the
producer's message id), ``TIMER_OUT_MS`` kept.  A message is never delivered before its time and
at most ``timerPrecisionMs`` (plus the put) after it.

No Python object stays per scheduled message: the schedule is the two files, and memory holds only
the records of the tick being delivered.

Crash safety (SIGKILL at any moment): every TimerLog record carries its rmq_sys_wheel_timer
offset, and :class:`~tidemq.broker.timer.checkpoint.TimerCheckpoint` keeps (ticks delivered, log
position settled, queue offset enqueued), written every ``timer_flush_interval_ms`` after the log
and the wheel are flushed.  Recovery re-links log records written after the checkpoint whose slot
update was lost, re-delivers those of them already due, continues the enqueue after the highest
queue offset found in the log, and the dequeue from the checkpoint's tick.  Delivery is therefore
at least once; the duplicates after a crash are at most the messages delivered in the last
``timer_flush_interval_ms + timerPrecisionMs`` before it (counted in ``recovered_redeliveries``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.broker.timer.checkpoint import TimerCheckpoint
from tidemq.broker.timer.properties import (
    TIMER_DEL_UNIQKEY,
    TIMER_OUT_MS,
    TIMER_PROPERTIES,
    TIMER_TOPIC,
    TimerRefused,
    deliver_ms_of,
    has_timer,
)
from tidemq.broker.timer.recall import RECALL_TAG, RecallHandle, decode_handle, delete_key
from tidemq.broker.timer.timer_log import NO_RECORD, RECORD_SIZE, TimerLog, TimerLogRecord
from tidemq.broker.timer.timer_wheel import TimerWheel
from tidemq.delay import delay_level_in
from tidemq.errors import ConfigError, CorruptDataError
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    Prop,
    decode_message,
)
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetStatus
from tidemq.tasks import supervise, wait_event

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: The consumer group the enqueue reads rmq_sys_wheel_timer with (store statistics only).
TIMER_GROUP = "TIMER_CONSUMER"
READ_BATCH = 256
IDLE_WAIT_S = 0.5
RETRY_AFTER_FAILURE_S = 1.0
#: GET_TIMER_CHECK_POINT's body: TimerCheckpoint.encode, seven big-endian longs.
_CHECKPOINT = struct.Struct(">7q")
#: 32 bytes each: 1 GiB of wheel at most (3 days at 1 s is 518 402 slots, 16 MiB).
MAX_SLOTS = 1 << 25
#: A slave's dequeue follows the clock this far behind: promoted by a failover, it delivers again
#: what was due in this window before (the dead master may not have), so failovers faster than this
#: lose nothing, and the duplicates they cause are the messages due in it.
SLAVE_BEHIND_MS = 30_000
#: Puts in flight at once while a tick is delivered.
DELIVER_WINDOW = 512


def _now_ms() -> int:
    return int(time.time() * 1000)


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
        #: A message due later than this is rolled (0: never).
        self.roll_window_ms: int = s.timer_roll_window_slots * self.precision_ms
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
        self.log: TimerLog | None = None
        self.wheel: TimerWheel | None = None
        #: rmq_sys_wheel_timer queue offset the enqueue reads next.
        self.queue_offset = 0
        #: Every tick before it is delivered; the tick being walked is ``done_tick`` meanwhile.
        self.done_tick = 0
        #: Records at or before this tick are delivered by the enqueue itself.
        self.claimed_tick = -1
        #: (log position, queue offset) with every record before them settled.
        self._settled = (0, 0)
        #: (log end, queue offset, direct deliveries in flight) per enqueued batch, in log order:
        #: the settled point moves past a batch once its deliveries are done.
        self._unsettled: collections.deque[tuple[int, int, asyncio.Future[None] | None]] = collections.deque()
        self._recover: list[TimerLogRecord] = []
        self._stopped = False
        #: Recalls whose marker is not in the wheel yet: the next tick waits for them (a while).
        self._recalls_in_flight = 0
        # Figures (runtime info, metrics).
        self.enqueued = 0
        self.delivered = 0
        self.refused = 0
        #: Records in the wheel whose tick is not delivered yet.
        self.pending = 0
        #: Real topic -> messages waiting in the wheel (RocketMQ's timermetrics ``timingCount``),
        #: kept in the checkpoint; approximate after a crash.
        self.timing: dict[str, int] = {}
        self.checkpoints_written = 0
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=64)
        self.recovered_redeliveries = 0
        self.rolled = 0
        self.recalled = 0
        self.lateness_ms: list[int] = []  # last deliveries' lateness, bounded (metrics)
        self._events: tuple[asyncio.Event, asyncio.Event] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ put side
    def rewrite(self, msg: MessageInner, strict: bool = True) -> bool:
        """Park ``msg`` in rmq_sys_wheel_timer when a timer property asks for a later delivery.

        Returns True when the message was swapped; False when it carries no timer, is due now
        (stored in its topic at once), carries a delay level (which wins, as in RocketMQ: the timer
        properties are dropped), or is a transaction's half message (checked now, timed at commit).
        Bad timer properties raise :class:`TimerRefused` (``strict``) or are logged and the message
        is left to go at once (a transaction's commit, whose half message was checked when sent).
        """
        props = msg.properties
        if not has_timer(props):
            return False
        if delay_level_in(props) > 0:
            for name in TIMER_PROPERTIES:
                props.pop(name, None)
            return False
        if msg.topic == TIMER_TOPIC or TIMER_OUT_MS in props:
            return False  # already rolled through the wheel once
        tran = msg.sys_flag & TRANSACTION_TYPE_MASK
        # A committed message keeps TRAN_MSG=true; its sys flag says it is no longer a half.
        half = tran == TRANSACTION_PREPARED_TYPE or (
            tran == TRANSACTION_NOT_TYPE and props.get(Prop.TRANSACTION_PREPARED, "").lower() == "true"
        )
        if not half and tran not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            return False
        now = _now_ms()
        try:
            if not self.enabled:
                raise TimerRefused(
                    ResponseCode.SYSTEM_ERROR,
                    "accurate timer message is not enabled, timerWheelEnable is false",
                )
            deliver = deliver_ms_of(props, now, self.max_delay_sec)
        except TimerRefused as exc:
            if strict:
                self.refused += 1
                raise
            log.warning("timer of a message to %s ignored, delivered now: %s", msg.topic, exc.remark)
            return False
        if deliver <= now and TIMER_DEL_UNIQKEY in props:
            self.refused += 1
            raise TimerRefused(
                ResponseCode.MESSAGE_ILLEGAL, "timer message illegal: a delete marker's time has passed"
            )
        if half or deliver <= now:
            return False
        self._park(msg, deliver)
        return True

    def recall_handle(self, msg: MessageInner) -> str | None:
        """The recall handle of a parked message (None without a unique key)."""
        props = msg.properties
        uniq = props.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if msg.topic != TIMER_TOPIC or not uniq or TIMER_OUT_MS not in props:
            return None
        return RecallHandle(
            props[Prop.REAL_TOPIC], self.broker.settings.name, props[TIMER_OUT_MS], uniq
        ).encode()

    def rewrite_batch(self, msgs: Sequence[MessageInner]) -> bool:
        """A batch with a timer on any message: all its messages wait in the wheel, each until its
        own time (those without one, or due, at once), so the batch stays one put to one queue."""
        if not any(has_timer(m.properties) for m in msgs):
            return False
        if not self.enabled:
            self.refused += 1
            raise TimerRefused(
                ResponseCode.SYSTEM_ERROR, "accurate timer message is not enabled, timerWheelEnable is false"
            )
        now = _now_ms()
        try:
            times = [
                deliver_ms_of(m.properties, now, self.max_delay_sec) if has_timer(m.properties) else now
                for m in msgs
            ]
        except TimerRefused:
            self.refused += 1
            raise
        for msg, deliver in zip(msgs, times, strict=True):
            self._park(msg, max(deliver, now))
        return True

    @staticmethod
    def _park(msg: MessageInner, deliver: int) -> None:
        props = msg.properties
        props[TIMER_OUT_MS] = str(deliver)
        props[Prop.REAL_TOPIC] = msg.topic
        props[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
        msg.topic = TIMER_TOPIC
        msg.queue_id = 0

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Open the files and recover from the checkpoint (before the store starts)."""
        self.log = TimerLog(self.log_dir)
        self.wheel = TimerWheel(self.wheel_path, self.slots)
        now_tick = _now_ms() // self.precision_ms
        cp = TimerCheckpoint.load(self.checkpoint_path)
        if cp is None and self.log.end:
            # The log without its checkpoint: which records went out is unknown.  Everything due
            # within the longest delay is delivered again rather than anything lost.
            log.warning(
                "%s missing: timer messages due since %d s ago are delivered again",
                self.checkpoint_path,
                self.max_delay_sec,
            )
            cp = TimerCheckpoint((now_tick - self.slots // 2) * self.precision_ms, 0, 0, 0, 0)
        elif cp is None:
            cp = TimerCheckpoint(now_tick * self.precision_ms, 0, 0, self.precision_ms, self.slots)
        self.done_tick = cp.last_read_time_ms // self.precision_ms
        self.queue_offset = cp.last_timer_queue_offset
        self.timing = {topic: n for topic, n in cp.timing_count.items() if n > 0}
        if self.wheel.fresh or cp.precision_ms != self.precision_ms or cp.slots != self.slots:
            self._rebuild_wheel()
        else:
            self._recover_tail(cp.last_timer_log_flush_pos)
        self.claimed_tick = self.done_tick - 1
        self.pending = self._count_pending()
        self._settled = (self.log.end, self.queue_offset)
        log.info(
            "timer: %d log records, %d pending, enqueue from queue offset %d, deliver from %d ms, %d to re-deliver",
            self.log.end // RECORD_SIZE,
            self.pending,
            self.queue_offset,
            self.done_tick * self.precision_ms,
            len(self._recover),
        )

    def _chain(self, tick: int) -> tuple[int, int, int, int]:
        """(prev_pos, first_pos, num, slot tick) a new record of ``tick`` joins its slot with: the
        slot's chain is kept while it may hold undelivered records, else started again."""
        assert self.wheel is not None
        slot = self.wheel.get(tick)
        if slot is not None and slot.num and slot.tick >= self.done_tick:
            return slot.last_pos, slot.first_pos, slot.num, max(slot.tick, tick)
        return NO_RECORD, -1, 0, tick

    def _link(self, rec_size: int, deliver_ms: int, phy: int, qoff: int, now: int) -> tuple[int, int, int]:
        """Append a record, then chain it into its slot (in that order: a crash between the two
        leaves a record recovery re-links); (its position, its tick, when the wheel acts on it).

        A message due beyond the roll window is chained at the window's end instead, where it is
        put back into rmq_sys_wheel_timer (RocketMQ's roll): its commit-log copy stays younger
        than the window, whatever the commit log's retention."""
        assert self.log is not None and self.wheel is not None
        due_ms = min(deliver_ms, now + self.roll_window_ms) if self.roll_window_ms else deliver_ms
        tick = due_ms // self.precision_ms
        prev, first, num, slot_tick = self._chain(tick)
        pos = self.log.append(rec_size, prev, due_ms, deliver_ms, phy, qoff)
        self.wheel.put(slot_tick, first if num else pos, pos, num + 1)
        return pos, tick, due_ms

    def _recover_tail(self, settled_pos: int) -> None:
        """Records after the checkpoint: re-link the one whose slot update a crash cut off, find
        the enqueue progress, and keep those already due for re-delivery."""
        assert self.log is not None and self.wheel is not None
        for rec in self.log.scan(settled_pos):
            tick = rec.due_ms // self.precision_ms
            self.queue_offset = max(self.queue_offset, rec.queue_offset + 1)
            if tick < self.done_tick:
                self._recover.append(rec)
                continue
            slot = self.wheel.get(tick)
            if slot is None or not slot.num or slot.last_pos < rec.pos:
                self._relink(rec, tick)

    def _relink(self, rec: TimerLogRecord, tick: int) -> None:
        assert self.log is not None and self.wheel is not None
        prev, first, num, slot_tick = self._chain(tick)
        self.log.set_prev(rec.pos, prev)
        self.wheel.put(slot_tick, first if num else rec.pos, rec.pos, num + 1)

    def _rebuild_wheel(self) -> None:
        """A new or re-shaped wheel: chain every record not yet delivered again."""
        assert self.log is not None and self.wheel is not None
        self.wheel.clear()
        for rec in self.log.scan(0):
            self.queue_offset = max(self.queue_offset, rec.queue_offset + 1)
            tick = rec.due_ms // self.precision_ms
            if tick >= self.done_tick:
                self._relink(rec, tick)
        # A new data directory makes an empty wheel too: only a rebuild over records is news.
        log.log(
            logging.WARNING if self.log.end else logging.INFO,
            "timer wheel rebuilt from the timer log (%d slots of %d ms)",
            self.slots,
            self.precision_ms,
        )

    def _count_pending(self) -> int:
        """Records in the wheel not yet delivered (reads every slot once, at load)."""
        assert self.wheel is not None
        return sum(num for tick_of, num in self.wheel.ticks_and_counts() if tick_of >= self.done_tick)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen for arrivals in rmq_sys_wheel_timer (call before the store starts)."""
        self._loop = loop
        self._events = (asyncio.Event(), asyncio.Event())
        self.store.add_arrival_listener(self._on_arrival, _is_timer_queue)

    def start(self) -> None:
        """Start the enqueue, dequeue and checkpoint tasks.

        On a slave the enqueue builds its own log and wheel from the replicated
        rmq_sys_wheel_timer and the dequeue delivers nothing: it follows the clock
        ``SLAVE_BEHIND_MS`` behind, so that a slave promoted by a failover delivers what was due
        in that window again (the old master may not have) and everything due after it.
        """
        if self._loop is None:
            self.attach(asyncio.get_running_loop())
        if self._tasks or self.log is None:
            return
        if self._stopped:  # started again in this process (a role change)
            self._stopped = False
            self._recover_tail(self._settled[0])
            self.done_tick = max(self.done_tick, (_now_ms() - SLAVE_BEHIND_MS) // self.precision_ms)
            self.claimed_tick = self.done_tick - 1
            top = self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
            if self.queue_offset > top:  # this replica's log was cut back when it was deposed
                log.warning(
                    "timer: queue offset %d past the queue's end %d, moved back", self.queue_offset, top
                )
                self.queue_offset = top
        self._tasks.append(supervise(self._enqueue_loop, "tidemq-timer-enqueue"))
        self._tasks.append(supervise(self._dequeue_loop, "tidemq-timer-dequeue"))
        self._tasks.append(supervise(self._checkpoint_loop, "tidemq-timer-checkpoint"))

    async def stop(self) -> None:
        # Direct deliveries still running stay unsettled: delivered again after the restart.
        running = [f for _, _, f in self._unsettled if f is not None and not f.done()]
        for task in [*self._tasks, *running]:
            task.cancel()
        await asyncio.gather(*self._tasks, *running, return_exceptions=True)
        self._tasks.clear()
        self._unsettled.clear()
        self._stopped = True
        if self.log is not None:
            try:
                self.persist()
            except OSError as exc:
                log.error("cannot write %s: %s", self.checkpoint_path, exc)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.wheel is not None:
            self.wheel.close()

    def checkpoint(self) -> TimerCheckpoint:
        self._settle()
        pos, qoff = self._settled
        return TimerCheckpoint(
            self.done_tick * self.precision_ms, pos, qoff, self.precision_ms, self.slots, dict(self.timing)
        )

    def persist(self) -> None:
        """Flush the log and the wheel, then write the checkpoint (in that order: it claims them)."""
        assert self.log is not None and self.wheel is not None
        cp = self.checkpoint()
        self.log.flush()
        self.wheel.flush()
        cp.save(self.checkpoint_path)
        self.checkpoints_written += 1

    # ------------------------------------------------------------------ figures
    def backlog(self) -> int:
        """Messages parked and not yet delivered: in the wheel, or stored and not yet enqueued."""
        waiting = self.store.get_max_offset_in_queue(TIMER_TOPIC, 0) - self.queue_offset
        return self.pending + max(0, waiting)

    def enqueue_behind(self) -> int:
        """Messages in rmq_sys_wheel_timer not yet in the wheel (RocketMQ's timerOffsetBehind)."""
        return max(0, self.store.get_max_offset_in_queue(TIMER_TOPIC, 0) - self.queue_offset)

    def dequeue_behind_ms(self) -> int:
        """How far the delivery lags the clock (0 when it keeps up; RocketMQ's timerReadBehind in ms)."""
        return max(0, _now_ms() - (self.done_tick + 1) * self.precision_ms)

    def tps(self) -> tuple[float, float]:
        """(enqueued, delivered) per second over the last ~10 s of checkpoints."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        t1, e1, d1 = self._samples[-1]
        t0, e0, d0 = next(s for s in self._samples if t1 - s[0] <= 10.0)
        span = t1 - t0
        return ((e1 - e0) / span, (d1 - d0) / span) if span > 0 else (0.0, 0.0)

    def runtime_info(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's timer keys, with RocketMQ 5's names."""
        enq, deq = self.tps()
        return {
            "timerReadBehind": str(self.dequeue_behind_ms() // 1000),
            "timerOffsetBehind": str(self.enqueue_behind()),
            "timerCongestNum": str(self.pending),
            "timerEnqueueTps": f"{enq:.2f}",
            "timerDequeueTps": f"{deq:.2f}",
        }

    def metric_values(self) -> dict[str, Any]:
        """Figures for Prometheus, under RocketMQ 5's timer metric names (tidemq_ for its own)."""
        late = sorted(self.lateness_ms)
        return {
            "rocketmq_timer_enqueue_lag": self.enqueue_behind(),
            "rocketmq_timer_dequeue_latency": self.dequeue_behind_ms(),
            "rocketmq_timer_enqueue_total": self.enqueued,
            "rocketmq_timer_dequeue_total": self.delivered,
            "rocketmq_timing_messages": dict(self.timing),
            "tidemq_timer_lateness_p99_ms": late[min(len(late) - 1, len(late) * 99 // 100)] if late else 0,
        }

    # ------------------------------------------------------------------ requests
    async def get_timer_check_point(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_CHECK_POINT (60): RocketMQ's 56-byte TimerCheckpoint encoding (seven longs)."""
        if self.log is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, "The checkpoint is null")
        cp = self.checkpoint()
        body = _CHECKPOINT.pack(
            cp.last_read_time_ms,
            cp.last_timer_log_flush_pos,
            cp.last_timer_queue_offset,
            cp.last_timer_queue_offset,  # masterTimerQueueOffset: this broker's own
            0,  # dataVersion.stateVersion
            _now_ms(),  # dataVersion.timestamp
            self.checkpoints_written,  # dataVersion.counter
        )
        return request.reply(ResponseCode.SUCCESS, body=body)

    async def recall_message(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """RECALL_MESSAGE (370, RocketMQ 5.5): park a delete marker due with the message it names.

        Answers as RocketMQ's RecallMessageProcessor: ILLEGAL_OPERATION for a bad handle, another
        topic or broker, or a time already passed (the message was delivered); SUCCESS otherwise,
        also for a message already recalled or never sent (the marker then cancels nothing).
        """
        b = self.broker
        fields = request.ext_fields or {}
        topic = str(fields.get("topic", ""))
        if not b.is_master:
            return request.reply(
                ResponseCode.SLAVE_NOT_AVAILABLE, "recall failed, broker service not available"
            )
        if b.topics.get(topic) is None:
            return request.reply(ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist")
        try:
            handle = decode_handle(str(fields.get("recallHandle", "")))
        except ValueError as exc:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, str(exc))
        if handle.topic != topic:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != b.settings.name:
            return request.reply(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available"
            )
        try:
            left = int(handle.timestamp) - _now_ms()
        except ValueError:
            left = -1
        due_tick = int(handle.timestamp) // self.precision_ms if left > 0 else 0
        if left <= 0 or left >= self.max_delay_sec * 1000 or due_tick <= self.claimed_tick:
            # Its tick is being (or was) delivered: too late, as for a time already passed.
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        now = _now_ms()
        marker = MessageInner(
            topic=topic,
            body=b"0",
            queue_id=0,
            properties={
                Prop.TAGS: RECALL_TAG,
                TIMER_DEL_UNIQKEY: delete_key(topic, handle.message_id),
                Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: handle.message_id,
                "TIMER_DELIVER_MS": handle.timestamp,
                Prop.PRODUCER_GROUP: str(fields.get("producerGroup", "")),
            },
            born_timestamp=now,
            born_host=b.store_host,
            store_host=b.store_host,
        )
        try:
            parked = self.rewrite(marker)
        except TimerRefused:
            parked = False
        if not parked:
            return request.reply(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        self._recalls_in_flight += 1
        try:
            result = await resolved(self.store.put_message(marker))
            if not result.ok:
                return request.reply(ResponseCode.SYSTEM_ERROR, "recall failed, execute error")
            # Answer once the marker is in the wheel: a recall answered SUCCESS cancels for sure.
            deadline = time.monotonic() + 2 * self.precision_ms / 1000
            while self.queue_offset <= result.queue_offset and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        finally:
            self._recalls_in_flight -= 1
        b.stats.on_put(TIMER_TOPIC, 1, result.wrote_bytes)
        return request.reply_with(ResponseCode.SUCCESS, None, {"msgId": handle.message_id})

    async def get_timer_metrics(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        """GET_TIMER_METRICS (61): RocketMQ's TimerMetricsSerializeWrapper (timing count per topic)."""
        now = _now_ms()
        body = {
            "dataVersion": {"counter": self.checkpoints_written, "stateVersion": 0, "timestamp": now},
            "timingCount": {
                topic: {"count": n, "timeStamp": now} for topic, n in sorted(self.timing.items())
            },
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))

    # ------------------------------------------------------------------ enqueue
    def _on_arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        if topic != TIMER_TOPIC or self._loop is None or self._events is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._events[0].set)
        except RuntimeError:
            pass  # the loop closed during shutdown

    async def _enqueue_loop(self) -> None:
        assert self._events is not None
        event = self._events[0]
        if self._recover:
            recs, self._recover = self._recover, []
            n = await self._deliver_records(recs)
            self.recovered_redeliveries += n
            if n:
                log.warning("timer: %d messages due before the crash delivered again (at least once)", n)
        while True:
            event.clear()
            try:
                more = await self._enqueue_some()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer enqueue failed")
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            if not more:
                await wait_event(event, IDLE_WAIT_S)

    async def _enqueue_some(self) -> bool:
        """Enqueue one batch of rmq_sys_wheel_timer; whether there may be more right now."""
        offset = self.queue_offset
        res = self.store.get_message(TIMER_GROUP, TIMER_TOPIC, 0, offset, READ_BATCH)
        if res.status is not GetStatus.FOUND:
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
                self.queue_offset = res.next_begin_offset
                self._settled = (self._settled[0], self.queue_offset)
                return True
            return False
        direct: list[TimerLogRecord] = []
        assert self.log is not None
        now = _now_ms()
        master = self.broker.is_master
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
            pos, tick, due = self._link(ext.store_size, deliver, ext.commit_log_offset, qoff, now)
            self.enqueued += 1
            if tick <= self.claimed_tick and master:  # its tick is being or was walked: delivered here
                direct.append(
                    TimerLogRecord(pos, ext.store_size, NO_RECORD, due, deliver, ext.commit_log_offset, qoff)
                )
            elif tick > self.claimed_tick:
                self.pending += 1
                if master:  # per-topic counts are the master's figure (a slave delivers nothing)
                    real = ext.properties[Prop.REAL_TOPIC]
                    self.timing[real] = self.timing.get(real, 0) + 1
        self.queue_offset = max(offset, res.next_begin_offset, res.queue_offsets[-1] + 1)
        delivering = asyncio.ensure_future(self._deliver_direct(direct)) if direct else None
        self._unsettled.append((self.log.end, self.queue_offset, delivering))
        self._settle()
        return True

    def _settle(self) -> None:
        while self._unsettled:
            pos, qoff, delivering = self._unsettled[0]
            if delivering is not None and not delivering.done():
                return
            self._unsettled.popleft()
            self._settled = (pos, qoff)

    async def _deliver_direct(self, records: list[TimerLogRecord]) -> None:
        """Records of a tick being or already walked: each at its time, retried until stored."""
        while True:
            try:
                await self._deliver_records(records, strict=True)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer: direct delivery failed, retried")
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)

    # ------------------------------------------------------------------ dequeue
    async def _dequeue_loop(self) -> None:
        walked = 0
        lagging = 0
        stored = 0
        while True:
            tick = self.done_tick
            wait_ms = tick * self.precision_ms - _now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
                continue
            walked += 1
            if walked % 1024 == 0:
                await asyncio.sleep(0)  # catching up after a downtime: let the loop breathe
            if not self.broker.is_master:  # a slave: follow the clock, deliver nothing
                behind = (_now_ms() - SLAVE_BEHIND_MS) // self.precision_ms
                if behind > self.done_tick:
                    self.pending = max(0, self.pending - self._count_ticks(self.done_tick, behind))
                    self.done_tick = behind
                    self.claimed_tick = behind - 1
                await asyncio.sleep(max(self.precision_ms / 1000, IDLE_WAIT_S))
                continue
            if lagging == 0:
                stored = self.store.get_max_offset_in_queue(TIMER_TOPIC, 0)
            if (self.queue_offset < stored or self._recalls_in_flight) and lagging < self.precision_ms // 10:
                # Stored before the tick began but not yet in the wheel: wait (up to one tick) so
                # that it is walked with the tick (a recall's marker above all).
                lagging += 1
                await asyncio.sleep(0.01)
                continue
            lagging = 0
            self.claimed_tick = tick
            try:
                records = self._due_records(tick)
                if records:
                    await self._deliver_records(records, strict=True, counted=True)
                    self.pending = max(0, self.pending - len(records))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer: delivery of tick %d failed, retried", tick)
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            self.done_tick = tick + 1

    def _count_ticks(self, first: int, end: int) -> int:
        """Records in the slots of ticks ``first`` .. ``end - 1`` (a slave skipping them)."""
        assert self.wheel is not None
        total = 0
        for tick in range(first, min(end, first + self.slots)):
            slot = self.wheel.get(tick)
            if slot is not None and slot.num and slot.tick == tick:
                total += slot.num
        return total

    def _due_records(self, tick: int) -> list[TimerLogRecord]:
        assert self.log is not None and self.wheel is not None
        slot = self.wheel.get(tick)
        if slot is None or not slot.num:
            return []
        out: list[TimerLogRecord] = []
        pos = slot.last_pos
        seen = 0
        while pos != NO_RECORD and seen < slot.num:
            rec = self.log.read(pos)
            if rec is None:
                if pos >= self.log.start:  # below it: a deleted file, whose records all went out
                    log.error(
                        "timer: slot of tick %d points at %d, not a record; rest of the slot skipped",
                        tick,
                        pos,
                    )
                break
            seen += 1
            if rec.due_ms // self.precision_ms == tick:
                out.append(rec)
            pos = rec.prev_pos
        out.reverse()  # log order: a producer's order among messages due in one tick
        return out

    async def _deliver_records(
        self, records: list[TimerLogRecord], strict: bool = False, counted: bool = False
    ) -> int:
        """Put each record's message to its real topic; how many went.  ``strict``: a failed put
        raises (the tick is retried whole: at least once)."""
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
            wait_ms = loaded[start][0].due_ms - _now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            now = _now_ms()
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
                    self._forget(props.get(Prop.REAL_TOPIC, ""), counted)
                    continue
                if deleted and delete_key(props.get(Prop.REAL_TOPIC, ""), ext.uniq_key or "") in deleted:
                    self.recalled += 1
                    self._forget(props.get(Prop.REAL_TOPIC, ""), counted)
                    continue
                msgs.append((rec, self._real_message(ext)))
            futures = [self.store.put_message(m) for _, m in msgs]
            results = await asyncio.gather(*(resolved(f) for f in futures), return_exceptions=True)
            now = _now_ms()
            failed = None
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
                self._forget(msg.properties.get(Prop.REAL_TOPIC, msg.topic), counted)
                if msg.topic == TIMER_TOPIC:
                    self.rolled += 1
                    continue
                self.delivered += 1
                self.broker.stats.on_put(msg.topic, 1, result.wrote_bytes)
                lateness = now - rec.deliver_ms
                if len(self.lateness_ms) >= 4096:
                    del self.lateness_ms[:2048]
                self.lateness_ms.append(lateness)
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

    def _forget(self, topic: str, counted: bool) -> None:
        """One message of ``topic`` left the wheel (the per-topic timing count)."""
        if not counted:
            return
        left = self.timing.get(topic, 0) - 1
        if left > 0:
            self.timing[topic] = left
        else:
            self.timing.pop(topic, None)

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

    # ------------------------------------------------------------------ checkpoint
    def _trim(self, cp: TimerCheckpoint) -> None:
        """Delete the log files all of whose records were delivered: settled before the checkpoint
        and written longer ago than any record's wait in the wheel (the roll window, or the
        longest delay without rolls)."""
        assert self.log is not None
        horizon_ms = self.roll_window_ms or self.max_delay_sec * 1000
        older_than_s = (cp.last_read_time_ms - horizon_ms - 2 * self.precision_ms) / 1000
        deleted = self.log.delete_before(cp.last_timer_log_flush_pos, older_than_s)
        if deleted:
            log.info("timer: %d delivered timer log file(s) deleted", deleted)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                cp = self.checkpoint()
                assert self.log is not None and self.wheel is not None
                await asyncio.to_thread(self.log.flush)
                await asyncio.to_thread(self.wheel.flush)
                await asyncio.to_thread(cp.save, self.checkpoint_path)
                self.checkpoints_written += 1
                self._trim(cp)
                self._samples.append((time.monotonic(), self.enqueued, self.delivered))
            except Exception:
                log.exception("cannot persist %s", self.checkpoint_path)


def _is_timer_queue(topic: str, queue_id: int) -> bool:
    return topic == TIMER_TOPIC
