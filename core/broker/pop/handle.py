"""RocketMQ 5's POP names and ack handles: retry topics (KeyBuilder) and ``extraInfo`` (ExtraInfoUtil).

A RocketMQ 5 client builds each message's ack handle (the ``POP_CK`` property, sent back as the
``extraInfo`` of ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME) from the POP response header::

    ckQueueOffset popTime invisibleTime reviveQid retry brokerName queueId msgQueueOffset

space separated; ``retry`` is ``0`` for the topic itself, ``1`` for the V1 retry topic
``%RETRY%<group>_<topic>`` and ``2`` for the V2 one ``%RETRY%<group>+<topic>``.  The broker
hands out the pieces in ``startOffsetInfo`` / ``msgOffsetInfo`` / ``orderCountInfo``:
``retry queueId value`` items joined by ``;``.
"""

from __future__ import annotations

import attrs

# The header's retry marks and info items, shared with the clients that read them (tidemq.pop_header).
from tidemq.pop_header import NORMAL as NORMAL
from tidemq.pop_header import RETRY_PREFIX as RETRY_PREFIX
from tidemq.pop_header import RETRY_V1 as RETRY_V1
from tidemq.pop_header import RETRY_V2 as RETRY_V2
from tidemq.pop_header import HandleError as HandleError
from tidemq.pop_header import info_items as info_items
from tidemq.pop_header import parse_info as parse_info
from tidemq.pop_header import retry_mark as retry_mark

DLQ_PREFIX = "%DLQ%"
#: RocketMQ's KeyBuilder.POP_ORDER_REVIVE_QUEUE: the reviveQid of an orderly (FIFO) pop.
ORDER_REVIVE_QUEUE = 999


def retry_topic_v1(topic: str, group: str) -> str:
    """``%RETRY%<group>_<topic>``: the retry topic RocketMQ 5 POP uses by default."""
    return f"{RETRY_PREFIX}{group}_{topic}"


def retry_topic_v2(topic: str, group: str) -> str:
    """``%RETRY%<group>+<topic>`` (RocketMQ's enableRetryTopicV2)."""
    return f"{RETRY_PREFIX}{group}+{topic}"


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def real_topic(topic: str, group: str, mark: str) -> str:
    """The stored topic a handle names: ``topic`` itself or one of the group's retry topics."""
    if mark == NORMAL:
        return topic
    if mark == RETRY_V1:
        return retry_topic_v1(topic, group)
    if mark == RETRY_V2:
        return retry_topic_v2(topic, group)
    raise ValueError(f"retry mark {mark!r} is not 0, 1 or 2")


@attrs.frozen
class AckHandle:
    """One message's ack handle (RocketMQ's extraInfo), parsed."""

    ck_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry: str
    broker_name: str
    queue_id: int
    offset: int

    @classmethod
    def parse(cls, extra_info: str) -> AckHandle:
        return cls(*split_handle(extra_info))

    def format(self) -> str:
        return build_extra_info(
            self.ck_offset,
            self.pop_time,
            self.invisible_time,
            self.revive_qid,
            self.retry,
            self.broker_name,
            self.queue_id,
            self.offset,
        )


def split_handle(extra_info: str) -> tuple[int, int, int, int, str, str, int, int]:
    """An ack handle's items (:class:`AckHandle`'s fields, in order) without building one: the
    per-ack path.  A 7-item handle (no message offset) names its ckQueueOffset."""
    parts = extra_info.split(" ")
    n = len(parts)
    if n != 8 and n != 7:
        raise HandleError(f"extraInfo {extra_info[:120]!r} has {n} items, not 8")
    retry = parts[4]
    if retry != NORMAL and retry != RETRY_V1 and retry != RETRY_V2:
        raise HandleError(f"extraInfo {extra_info[:120]!r}: retry item {retry!r} is not 0, 1 or 2")
    try:
        ck = int(parts[0])
        return (
            ck,
            int(parts[1]),
            int(parts[2]),
            int(parts[3]),
            retry,
            parts[5],
            int(parts[6]),
            int(parts[7]) if n == 8 else ck,
        )
    except ValueError:
        raise HandleError(f"extraInfo {extra_info[:120]!r} holds a non-number") from None


def build_extra_info(
    ck_offset: int,
    pop_time: int,
    invisible_time: int,
    revive_qid: int,
    retry: str,
    broker_name: str,
    queue_id: int,
    offset: int,
) -> str:
    return f"{ck_offset} {pop_time} {invisible_time} {revive_qid} {retry} {broker_name} {queue_id} {offset}"
