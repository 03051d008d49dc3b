"""Message queues, and the client-side strategies over them (roles ``allocate`` and ``select``)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker."""

    topic: str
    broker_name: str
    queue_id: int


class BoundaryType(enum.Enum):
    """SEARCH_OFFSET_BY_TIMESTAMP's ``boundaryType`` (RocketMQ 5's BoundaryType): of several
    messages stored at the very time asked, LOWER answers the first, UPPER the last.  LOWER also
    answers the first offset stored after a time none has, UPPER the last one before it."""

    LOWER = "LOWER"
    UPPER = "UPPER"


@runtime_checkable
class AllocateStrategy(Protocol):
    """Rebalance: which queues this consumer of the group owns (AllocateMessageQueueStrategy)."""

    name: str

    def allocate(
        self, group: str, current_id: str, queues: Sequence[MessageQueue], consumer_ids: Sequence[str]
    ) -> list[MessageQueue]: ...


@runtime_checkable
class QueueSelector(Protocol):
    """Producer-side queue choice with fault avoidance (MQFaultStrategy)."""

    def select(
        self, topic: str, queues: Sequence[MessageQueue], last_broker: str | None = None
    ) -> MessageQueue:
        """Pick the queue for the next send; ``last_broker`` failed the previous try."""

    def record(self, broker_name: str, latency_ms: float, failed: bool) -> None:
        """Learn from a send's latency or failure."""
