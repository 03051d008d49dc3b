"""Remoting requests as RocketMQ 4.x producers send them, for tests of a broker or a transport."""

from __future__ import annotations

import time
from typing import Any

from tidemq.message import properties_to_string
from tidemq.remoting import RemotingCommand, RequestCode

__all__ = ["SEND_FIELD_NAMES", "send_fields", "send_request"]

#: SendMessageRequestHeader's fields in SEND_MESSAGE_V2's order (its single-letter names a..k).
SEND_FIELD_NAMES = (
    "producerGroup topic defaultTopic defaultTopicQueueNums queueId sysFlag bornTimestamp flag "
    "properties reconsumeTimes unitMode"
).split()


def send_fields(
    topic: str, queue_id: int = 0, props: dict[str, str] | None = None, v2: bool = False
) -> dict[str, Any]:
    """A SEND_MESSAGE header of producer group ``PG`` (``v2``: SEND_MESSAGE_V2's short names)."""
    fields: dict[str, Any] = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string(props or {}),
        "reconsumeTimes": 0,
        "unitMode": False,
    }
    if v2:
        return {chr(ord("a") + i): fields[n] for i, n in enumerate(SEND_FIELD_NAMES)}
    return fields


def send_request(
    topic: str, body: bytes, props: dict[str, str] | None = None, queue_id: int = 0
) -> RemotingCommand:
    """A SEND_MESSAGE request of one message."""
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, send_fields(topic, queue_id, props), body)
