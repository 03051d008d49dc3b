"""The put side: a message with a timer property is parked in ``rmq_sys_wheel_timer``.

:meth:`TimerParking.rewrite` (called by the send paths after the send hooks, so ACLs and plugins
judge the topic the producer named) checks ``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC`` or
``TIMER_DELAY_MS``, and gives the message ``TIMER_OUT_MS`` (when it is due), ``REAL_TOPIC`` and
``REAL_QID``; it is then stored in ``rmq_sys_wheel_timer`` queue 0 like any message, so it is
acknowledged only once stored, and replicated and queryable by key as any message is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidemq.broker.timer.properties import (
    TIMER_DEL_UNIQKEY,
    TIMER_OUT_MS,
    TIMER_PROPERTIES,
    TIMER_TOPIC,
    TimerRefused,
    deliver_ms_of,
    has_timer,
)
from tidemq.broker.timer.recall import RecallHandle
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.delay import delay_level_in
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    Prop,
)
from tidemq.remoting.codes import ResponseCode

log = logging.getLogger(__name__)

_DISABLED = "accurate timer message is not enabled, timerWheelEnable is false"


class TimerParking:
    """Checks timer properties and swaps a message to ``rmq_sys_wheel_timer`` (never raises but
    :class:`TimerRefused`)."""

    def __init__(self, schedule: TimerSchedule, enabled: bool, broker_name: str) -> None:
        self.schedule = schedule
        self.enabled = enabled
        self.broker_name = broker_name

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
        now = now_ms()
        try:
            if not self.enabled:
                raise TimerRefused(ResponseCode.SYSTEM_ERROR, _DISABLED)
            deliver = deliver_ms_of(props, now, self.schedule.max_delay_sec)
        except TimerRefused as exc:
            if strict:
                self.schedule.refused += 1
                raise
            log.warning("timer of a message to %s ignored, delivered now: %s", msg.topic, exc.remark)
            return False
        if deliver <= now and TIMER_DEL_UNIQKEY in props:
            self.schedule.refused += 1
            raise TimerRefused(
                ResponseCode.MESSAGE_ILLEGAL, "timer message illegal: a delete marker's time has passed"
            )
        if half or deliver <= now:
            return False
        park(msg, deliver)
        return True

    def rewrite_batch(self, msgs: Sequence[MessageInner]) -> bool:
        """A batch with a timer on any message: all its messages wait in the wheel, each until its
        own time (those without one, or due, at once), so the batch stays one put to one queue."""
        if not any(has_timer(m.properties) for m in msgs):
            return False
        if not self.enabled:
            self.schedule.refused += 1
            raise TimerRefused(ResponseCode.SYSTEM_ERROR, _DISABLED)
        now = now_ms()
        try:
            times = [
                deliver_ms_of(m.properties, now, self.schedule.max_delay_sec)
                if has_timer(m.properties)
                else now
                for m in msgs
            ]
        except TimerRefused:
            self.schedule.refused += 1
            raise
        for msg, deliver in zip(msgs, times, strict=True):
            park(msg, max(deliver, now))
        return True

    def recall_handle(self, msg: MessageInner) -> str | None:
        """The recall handle of a parked message (None without a unique key)."""
        props = msg.properties
        uniq = props.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if msg.topic != TIMER_TOPIC or not uniq or TIMER_OUT_MS not in props:
            return None
        return RecallHandle(props[Prop.REAL_TOPIC], self.broker_name, props[TIMER_OUT_MS], uniq).encode()


def park(msg: MessageInner, deliver: int) -> None:
    """Swap ``msg`` to rmq_sys_wheel_timer queue 0, due at ``deliver`` (epoch ms)."""
    props = msg.properties
    props[TIMER_OUT_MS] = str(deliver)
    props[Prop.REAL_TOPIC] = msg.topic
    props[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
    msg.topic = TIMER_TOPIC
    msg.queue_id = 0
