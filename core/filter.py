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


@runtime_checkable
class EntryPrefilter(Protocol):
    """A filter that can also judge a queue entry by position (the SQL92 filter's bloom bit map,
    like RocketMQ's ConsumeQueueExt): asked after ``matches_tags_code``; False skips the entry without
    reading the record, True means "maybe" (``matches_message`` still decides)."""

    def matches_queue_entry(self, topic: str, queue_id: int, queue_offset: int) -> bool: ...


@runtime_checkable
class SelectsEverything(Protocol):
    """A filter that may know it matches every message (``*``): the store then reads no properties."""

    matches_all: bool


@runtime_checkable
class FilterFactory(Protocol):
    """Compiles expressions of one type; :class:`ValueError` for an invalid expression."""

    def compile(self, expression: str) -> MessageFilter: ...
