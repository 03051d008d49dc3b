"""POP consumption (RocketMQ 5, issue 39): pop, ack, change invisibility, notification, assignment.

The engine, :class:`tidemq.broker.pop.PopService`, already takes plain values and returns typed
results (:class:`PopResult` with its :class:`PoppedBatch` list, refusals as :class:`PopError`
whose ``code`` is RocketMQ's response code), so this module names it as the service a transport
calls rather than wrapping it again.  The composition root builds it (``BrokerParts.pop``); the
broker publishes it as ``BrokerContext.pop`` (its figures, :class:`tidemq.context.PopFigures`).
"""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.broker.pop.results import (
    INVALID_PARAMETER,
    MAX_BATCH_ACK,
    POLLING_TIMEOUT,
    PopError,
    PoppedBatch,
    PopResult,
)
from tidemq.broker.pop.service import PopService
from tidemq.errors import PluginError

__all__ = [
    "INVALID_PARAMETER",
    "MAX_BATCH_ACK",
    "POLLING_TIMEOUT",
    "PopError",
    "PopResult",
    "PopService",
    "PoppedBatch",
    "pop_service",
]


def pop_service(broker: BrokerContext) -> PopService:
    """The POP engine of ``broker`` (``broker.pop``, built by the composition root)."""
    engine = broker.pop
    if not isinstance(engine, PopService):
        raise PluginError(
            f"the broker's pop is a {type(engine).__name__}, not the POP engine the services call"
        )
    return engine
