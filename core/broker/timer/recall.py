"""RocketMQ 5.5's recall handle: ``base64url("v1 <topic> <brokerName> <timestamp> <messageId>")``.

The send result of a timer message carries it (``recallHandle``); RECALL_MESSAGE (370) takes it
back and parks a delete marker (``TIMER_DEL_UNIQKEY = <topic>+<messageId>``) due at the same
moment, which cancels the message when their tick is delivered.
"""

from __future__ import annotations

import base64
import binascii

import attrs

VERSION_1 = "v1"
#: The tag of the marker RECALL_MESSAGE parks (RocketMQ's RECALL_MESSAGE_TAG).
RECALL_TAG = "_RECALL_TAG_"


@attrs.frozen
class RecallHandle:
    topic: str
    broker_name: str
    timestamp: str
    message_id: str

    def encode(self) -> str:
        raw = " ".join((VERSION_1, self.topic, self.broker_name, self.timestamp, self.message_id))
        return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_handle(handle: str) -> RecallHandle:
    """The handle's fields, or ValueError with RocketMQ's words."""
    if not handle or not handle.strip():
        raise ValueError("recall handle is invalid")
    try:
        raw = base64.urlsafe_b64decode(handle.encode() + b"=" * (-len(handle) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("recall handle is invalid") from None
    parts = raw.split(" ")
    if len(parts) < 5 or parts[0] != VERSION_1:
        raise ValueError("recall handle is invalid")
    return RecallHandle(parts[1], parts[2], parts[3], parts[4])


def delete_key(topic: str, message_id: str) -> str:
    """TimerMessageStore.buildDeleteKey: a message named by its real topic and unique key."""
    return f"{topic}+{message_id}"
