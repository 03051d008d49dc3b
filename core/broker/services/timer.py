"""Timer messages (RocketMQ 5, issue 36): GET_TIMER_CHECK_POINT, GET_TIMER_METRICS, RECALL_MESSAGE.

The engine, :class:`tidemq.broker.timer.TimerMessageStore`, serves these three requests itself
(their answers are RocketMQ's encodings of its checkpoint and figures), so this module names it as
the service a transport registers rather than wrapping it again; the send paths park timer
messages through ``BrokerContext.timers`` (:class:`tidemq.context.TimerService`).  The composition
root builds it (``BrokerParts.timers``).
"""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.broker.timer import TimerMessageStore, TimerRefused
from tidemq.errors import PluginError

__all__ = ["TimerMessageStore", "TimerRefused", "timer_service"]


def timer_service(broker: BrokerContext) -> TimerMessageStore:
    """The timer engine of ``broker`` (``broker.timers``, built by the composition root)."""
    engine = broker.timers
    if not isinstance(engine, TimerMessageStore):
        raise PluginError(
            f"the broker's timers is a {type(engine).__name__}, not the timer engine the services call"
        )
    return engine
