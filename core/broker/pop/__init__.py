"""POP consumption (RocketMQ 5): per-message ack and invisibility, persisted; see ``docs/pop.md``."""

from tidemq.broker.pop.handle import AckHandle, HandleError, retry_topic_v1, retry_topic_v2
from tidemq.broker.pop.results import PopError, PoppedBatch, PopResult
from tidemq.broker.pop.service import PopService

__all__ = [
    "AckHandle",
    "HandleError",
    "PopError",
    "PopResult",
    "PopService",
    "PoppedBatch",
    "retry_topic_v1",
    "retry_topic_v2",
]
