"""Client-side message types: what a producer sends and what a send or pull returns.

Message ids follow RocketMQ's MessageClientIDSetter: 16 bytes as 32 upper-case hex digits,
``ip(4) pid(2) random(4)`` fixed per process, then ``ms since the start of the month(4)`` and a
wrapping ``counter(2)``.  The id travels as the ``UNIQ_KEY`` property.
"""

from __future__ import annotations

import calendar
import enum
import ipaddress
import itertools
import os
import threading
import time
from collections.abc import Iterable, Mapping

import attrs

from tidemq.message import MessageExt, Prop, local_ip
from tidemq.queues import MessageQueue


def _keys(value: str | Iterable[str] | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return " ".join(value)


@attrs.define
class Message:
    """A message to send.  ``keys`` are indexed by the broker (QUERY_MESSAGE by key)."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = attrs.field(default=None)
    properties: dict[str, str] = attrs.field(factory=dict)
    flag: int = 0
    delay_level: int = 0
    wait_store_msg_ok: bool = True

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise TypeError(f"message body must be bytes, not {type(self.body).__name__}")
        if not self.topic:
            raise ValueError("message topic must not be empty")

    def wire_properties(self) -> dict[str, str]:
        """Properties as sent: user properties plus TAGS, KEYS, DELAY and WAIT."""
        props = dict(self.properties)
        if self.tags:
            props[Prop.TAGS] = self.tags
        keys = _keys(self.keys)
        if keys:
            props[Prop.KEYS] = keys
        if self.delay_level > 0:
            props[Prop.DELAY_TIME_LEVEL] = str(self.delay_level)
        props[Prop.WAIT_STORE_MSG_OK] = "true" if self.wait_store_msg_ok else "false"
        return props


class SendStatus(enum.Enum):
    """How a successful send was stored (RocketMQ's SendStatus)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@attrs.frozen
class SendResult:
    """What the broker answered: ``msg_id`` is the UNIQ_KEY, ``offset_msg_id`` the store id."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    region_id: str = ""
    broker_address: str = ""


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@attrs.frozen
class PullResult:
    """One pull: messages found and where to pull next."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = attrs.field(factory=list)
    suggest_broker_id: int = 0


class UniqueIdGenerator:
    """Thread-safe generator of RocketMQ-style unique client message ids."""

    def __init__(self, ip: str | None = None, pid: int | None = None) -> None:
        try:
            packed = ipaddress.ip_address(ip or local_ip()).packed[-4:]
        except ValueError:
            packed = bytes(4)
        pid = os.getpid() if pid is None else pid
        prefix = packed + (pid & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
        self._prefix = prefix.hex().upper()
        self._counter = itertools.count(int.from_bytes(os.urandom(2), "big"))
        self._lock = threading.Lock()
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        t = time.gmtime(now_ms / 1000)
        start = calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        self._month_start_ms = start * 1000
        self._next_month_ms = calendar.timegm((year, month, 1, 0, 0, 0)) * 1000

    def next_id(self) -> str:
        now_ms = int(time.time() * 1000)
        with self._lock:
            if now_ms >= self._next_month_ms:
                self._roll_month(now_ms)
            elapsed = (now_ms - self._month_start_ms) & 0xFFFFFFFF
            count = next(self._counter) & 0xFFFF
        return f"{self._prefix}{elapsed:08X}{count:04X}"


_ids = UniqueIdGenerator()


def new_message_id() -> str:
    """A fresh UNIQ_KEY for a message sent by this process."""
    return _ids.next_id()


def queue_to_json(mq: MessageQueue) -> dict[str, object]:
    return {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id}


def queue_from_json(d: Mapping[str, object]) -> MessageQueue:
    return MessageQueue(str(d["topic"]), str(d["brokerName"]), int(d["queueId"]))  # type: ignore[call-overload]
