"""The ``TAG`` expression type: ``*`` or tags joined by ``||`` (RocketMQ's FilterAPI).

A :class:`TagFilter` decides on the tag code stored in the ConsumeQueue entry (the Java
``String.hashCode`` of the tag), which is cheap but may collide, then on the stored TAGS property,
exact.  RocketMQ's broker stops at the code (``ExpressionMessageFilter.isMatchedByCommitLog``
returns true for TAG) and its client drops a colliding tag; tidemq's broker compares the tag as
well, so a colliding tag is never served.  The filter is a :class:`tidemq.SelectsByTag`: a store
that knows it walks the queue once, checking the code and then reading TAGS in place from the
record, without decoding it to a message (the mmap store's pull walk).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from tidemq.message import Prop, java_string_hash

SUB_ALL = "*"


def parse_tags(expression: str) -> frozenset[str]:
    """The tags of an expression; the empty set means every message (``*`` or blank)."""
    expression = (expression or "").strip()
    if not expression or expression == SUB_ALL:
        return frozenset()
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags:
        raise ValueError(f"tag expression {expression!r} names no tag")
    return tags


@attrs.frozen
class TagFilter:
    """A compiled TAG subscription; ``tags`` empty means ``*``."""

    tags: frozenset[str]
    codes: frozenset[int]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def matches_tags_code(self, tags_code: int) -> bool:
        return not self.tags or tags_code in self.codes

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        if not self.tags:
            return True
        return properties.get(Prop.TAGS) in self.tags

    def selected_tags(self) -> frozenset[str]:
        """:class:`tidemq.SelectsByTag`: exactly these tags (the store may filter in its walk)."""
        return self.tags


class TagFilterFactory:
    """Compiles TAG expressions (a :class:`tidemq.filter.FilterFactory`)."""

    def compile(self, expression: str) -> TagFilter:
        tags = parse_tags(expression)
        return TagFilter(tags, frozenset(java_string_hash(t) for t in tags))
