"""Timer messages (RocketMQ 5's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS), kept on disk.

See :mod:`tidemq.broker.timer.message_store` for the design.
"""

from tidemq.broker.timer.message_store import TimerMessageStore
from tidemq.broker.timer.properties import (
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    TimerRefused,
)

__all__ = [
    "TIMER_DELAY_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELIVER_MS",
    "TIMER_OUT_MS",
    "TIMER_TOPIC",
    "TimerMessageStore",
    "TimerRefused",
]
