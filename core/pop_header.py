"""RocketMQ 5's POP response header as both sides read it: retry marks and info items.

A POP_MESSAGE answer tells its reader, for each (stored topic, queue) it popped from, the
checkpoint's start offset (``startOffsetInfo``), the messages' offsets (``msgOffsetInfo``) and, for
an orderly pop, the attempt count (``orderCountInfo``): ``retry queueId value`` items joined by
``;`` (RocketMQ's ExtraInfoUtil).  ``retry`` marks the stored topic: ``0`` the topic itself, ``1``
the V1 retry topic ``%RETRY%<group>_<topic>``, ``2`` the V2 one ``%RETRY%<group>+<topic>``.  The
broker writes them (``tidemq.broker.pop``); a remoting POP client (``tidemq.client.SimpleConsumer``,
the gRPC proxy) reads them to build each message's ack handle, and a v5 endpoint inside a broker
names the same marks.  Public through ``__all__``; it imports nothing of the broker.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "NORMAL",
    "HandleError",
    "RETRY_PREFIX",
    "RETRY_V1",
    "RETRY_V2",
    "info_items",
    "parse_info",
    "retry_mark",
]

#: What every retry topic starts with (RocketMQ's MixAll.RETRY_GROUP_TOPIC_PREFIX).
RETRY_PREFIX = "%RETRY%"
#: The retry marks: the topic itself, the V1 retry topic, the V2 retry topic.
NORMAL, RETRY_V1, RETRY_V2 = "0", "1", "2"


class HandleError(ValueError):
    """An ack handle (or an info header) that does not parse."""


def retry_mark(topic: str) -> str:
    """The ``retry`` item of a handle for messages read from the stored ``topic``."""
    if topic.startswith(RETRY_PREFIX):
        return RETRY_V2 if "+" in topic else RETRY_V1
    return NORMAL


def info_items(items: Iterable[tuple[str, int, str]]) -> str:
    """``retry queueId value`` items joined by ``;`` (startOffsetInfo, msgOffsetInfo, orderCountInfo)."""
    return ";".join(f"{mark} {qid} {value}" for mark, qid, value in items)


def parse_info(info: str | None, *, skip_malformed: bool = False) -> dict[str, str]:
    """``"<retry>@<queueId>" -> value`` of an info header (ExtraInfoUtil.parse*Info's keys).

    An item that is not ``retry queueId value`` raises :class:`HandleError`, or is passed over with ``skip_malformed`` (a client reading a broker's answer
    keeps what it can read)."""
    out: dict[str, str] = {}
    if not info:
        return out
    for item in info.split(";"):
        parts = item.split(" ")
        if len(parts) != 3:
            if skip_malformed:
                continue
            raise HandleError(f"info item {item[:80]!r} is not 'retry queueId value'")
        out[f"{parts[0]}@{parts[1]}"] = parts[2]
    return out
