"""fastjson's maps keyed by MessageQueue (``{{"brokerName":"b","queueId":0,"topic":"T"}:5}``).

RocketMQ's ResetOffsetBody, GetConsumerStatusBody, ConsumerRunningInfo and ConsumeStats key maps
by MessageQueue objects; fastjson writes the key as the object itself, which is not JSON.  This
module writes that form (fields in fastjson's alphabetical order, integer keys bare) and reads it
back, also accepting a key given as the MessageQueue's JSON text in a string, or bare integer keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson

from tidemq.queues import MessageQueue

__all__ = ["MQJsonError", "dumps", "loads", "mq_key", "mq_map", "mq_to_json"]


class MQJsonError(ValueError):
    """A body that is neither JSON nor fastjson's MessageQueue-keyed form."""


def mq_to_json(mq: MessageQueue) -> dict[str, Any]:
    """A MessageQueue as fastjson writes it (alphabetical fields)."""
    return {"brokerName": mq.broker_name, "queueId": mq.queue_id, "topic": mq.topic}


def _key(key: Any) -> bytes:
    if isinstance(key, MessageQueue):
        return orjson.dumps(mq_to_json(key))
    if isinstance(key, bool) or not isinstance(key, int):
        return orjson.dumps(str(key))
    return str(key).encode()  # fastjson leaves Integer/Long keys unquoted


def dumps(value: Any) -> bytes:
    """JSON, except that MessageQueue and integer map keys are written as fastjson does."""
    if isinstance(value, Mapping):
        return b"{" + b",".join(_key(k) + b":" + dumps(v) for k, v in value.items()) + b"}"
    if isinstance(value, list | tuple | set | frozenset):
        return b"[" + b",".join(dumps(v) for v in value) + b"]"
    if isinstance(value, MessageQueue):
        return orjson.dumps(mq_to_json(value))
    return orjson.dumps(value)


_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_WS = re.compile(r"[ \t\n\r]*")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def fail(self, what: str) -> MQJsonError:
        return MQJsonError(f"{what} at character {self.i}")

    def ws(self) -> None:
        m = _WS.match(self.s, self.i)
        self.i = m.end() if m else self.i

    def value(self, depth: int = 0) -> Any:
        if depth > 64:
            raise self.fail("nesting too deep")
        self.ws()
        if self.i >= len(self.s):
            raise self.fail("unexpected end")
        c = self.s[self.i]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            self.i += 1
            out: list[Any] = []
            self.ws()
            if self.s.startswith("]", self.i):
                self.i += 1
                return out
            while True:
                out.append(self.value(depth + 1))
                self.ws()
                if self.s.startswith(",", self.i):
                    self.i += 1
                elif self.s.startswith("]", self.i):
                    self.i += 1
                    return out
                else:
                    raise self.fail("expected ',' or ']'")
        if c == '"':
            try:
                text, self.i = json.decoder.scanstring(self.s, self.i + 1)  # type: ignore[attr-defined]
            except json.JSONDecodeError as exc:
                raise self.fail(f"bad string ({exc.msg})") from None
            return text
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.s.startswith(word, self.i):
                self.i += len(word)
                return val
        m = _NUMBER.match(self.s, self.i)
        if not m:
            raise self.fail(f"unexpected {c!r}")
        self.i = m.end()
        return float(m.group()) if (m.group(1) or m.group(2)) else int(m.group())

    def obj(self, depth: int) -> dict[Any, Any]:
        self.i += 1
        out: dict[Any, Any] = {}
        self.ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return out
        while True:
            key = self.value(depth + 1)
            if isinstance(key, dict):
                key = mq_key(key)
            elif isinstance(key, list):
                raise self.fail("a list as a key")
            self.ws()
            if not self.s.startswith(":", self.i):
                raise self.fail("expected ':'")
            self.i += 1
            out[key] = self.value(depth + 1)
            self.ws()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.s.startswith("}", self.i):
                self.i += 1
                return out
            else:
                raise self.fail("expected ',' or '}'")


def loads(data: bytes | bytearray | memoryview | str | None) -> Any:
    """Parse JSON or fastjson's form; object keys that are objects become MessageQueues."""
    if data is None:
        raise MQJsonError("no body")
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
    p = _Parser(text)
    value = p.value()
    p.ws()
    if p.i != len(text):
        raise p.fail("trailing data")
    return value


def mq_key(key: Any) -> MessageQueue:
    """A MessageQueue from a key: the object, or its JSON text in a string."""
    if isinstance(key, MessageQueue):
        return key
    if isinstance(key, str) and key.lstrip().startswith("{"):
        key = loads(key)
    if not isinstance(key, dict):
        raise MQJsonError(f"{key!r} is not a MessageQueue")
    try:
        return MessageQueue(str(key["topic"]), str(key["brokerName"]), int(key["queueId"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise MQJsonError(f"{key!r} is not a MessageQueue ({exc!r})") from None


def mq_map(value: Any, item: str | None = None) -> dict[MessageQueue, Any]:
    """A MessageQueue-keyed table from a parsed body field: the map form, or the list form whose
    rows carry topic/brokerName/queueId (``item`` then names the row's value field, else the row)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {mq_key(k): v for k, v in value.items()}
    if isinstance(value, list):
        out: dict[MessageQueue, Any] = {}
        for row in value:
            if not isinstance(row, dict):
                raise MQJsonError(f"{row!r} is not a queue row")
            out[mq_key(row)] = row.get(item) if item else row
        return out
    raise MQJsonError(f"{type(value).__name__} is not a MessageQueue table")
