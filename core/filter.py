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
class FilterFactory(Protocol):
    """Compiles expressions of one type; :class:`ValueError` for an invalid expression."""

    def compile(self, expression: str) -> MessageFilter: ...
