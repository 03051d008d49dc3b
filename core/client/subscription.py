"""Subscriptions (topic + tag/SQL92 expression) and turning pulled records into delivered messages."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import attrs

from tidemq.client.compression import decompress
from tidemq.client.errors import ClientError
from tidemq.errors import CorruptDataError
from tidemq.filter import EXPRESSION_SQL92, EXPRESSION_TAG
from tidemq.message import MessageExt, Prop, java_string_hash

log = logging.getLogger(__name__)

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


@attrs.define
class Subscription:
    """One subscribed topic (RocketMQ's SubscriptionData)."""

    topic: str
    expression: str = "*"
    expression_type: str = EXPRESSION_TAG
    tags: list[str] = attrs.field(factory=list)
    codes: list[int] = attrs.field(factory=list)
    version: int = attrs.field(factory=lambda: time.time_ns() // 1_000_000)

    @classmethod
    def build(
        cls, topic: str, expression: str | None = "*", expression_type: str = EXPRESSION_TAG
    ) -> Subscription:
        if not topic:
            raise ClientError("subscription topic must not be empty")
        expression = (expression or "*").strip() or "*"
        if expression_type not in (EXPRESSION_TAG, EXPRESSION_SQL92):
            raise ClientError(f"expression type {expression_type!r} is not TAG or SQL92")
        if expression_type == EXPRESSION_SQL92 or expression == "*":
            return cls(topic, expression, expression_type)
        tags = [t.strip() for t in expression.split("||") if t.strip()]
        if not tags:
            raise ClientError(f"tag expression {expression!r} names no tag; use '*' or 'TagA || TagB'")
        return cls(topic, expression, expression_type, tags, [java_string_hash(t) for t in tags])

    def to_json(self) -> dict[str, object]:
        return {
            "classFilterMode": False,
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": self.tags,
            "codeSet": self.codes,
            "subVersion": self.version,
            "expressionType": self.expression_type,
        }

    def accepts(self, msg: MessageExt) -> bool:
        """Client-side tag check: the broker filters on the tag hash only, collisions pass."""
        if not self.tags or self.expression_type != EXPRESSION_TAG:
            return True
        return msg.tags in self.tags


def prepare(
    messages: Iterable[MessageExt], sub: Subscription | None, group: str | None = None
) -> list[MessageExt]:
    """Filter by tag, decompress bodies and give retried messages their original topic back."""
    out = []
    for m in messages:
        if sub is not None and not sub.accepts(m):
            continue
        try:
            m.body = decompress(m.body, m.sys_flag)
        except CorruptDataError as exc:
            # A body that does not inflate (or inflates past the frame limit) is never handed
            # to the application; the queue moves on past it.
            log.error(
                "message %s of %s-%d at offset %d skipped: %s",
                m.msg_id,
                m.topic,
                m.queue_id,
                m.queue_offset,
                exc,
            )
            continue
        real = m.properties.get(Prop.RETRY_TOPIC)
        if real and group is not None and m.topic == retry_topic(group):
            m.topic = real
        out.append(m)
    return out
