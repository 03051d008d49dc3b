"""Message filtering contract (role ``filter``; names are expression types)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"


@runtime_checkable
class MessageFilter(Protocol):
    """A compiled subscription, asked twice: cheaply on the ConsumeQueue entry, then on the message."""

    def matches_tags_code(self, tags_code: int) -> bool:
        """Decide (or pre-select) from the ConsumeQueue entry alone; ``True`` keeps the message."""

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        """Decide on the decoded properties (exact tag, SQL92 expression...)."""

    # Optional, looked up with getattr by stores (not part of the runtime-checked protocol):
    #   matches_queue_entry(topic, queue_id, queue_offset) -> bool
    # asked after matches_tags_code; False skips the entry without reading the record (the
    # SQL92 filter answers it from a bit map written at dispatch time, like RocketMQ's
    # ConsumeQueueExt).  True means "maybe": matches_message still decides.


@runtime_checkable
class FilterFactory(Protocol):
    """Compiles expressions of one type; :class:`ValueError` for an invalid expression."""

    def compile(self, expression: str) -> MessageFilter: ...
