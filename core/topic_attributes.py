"""Topic attributes as RocketMQ 5 has them, and the ones tidemq knows: ``message.type`` and the
duplicate window's ``dedup.window.seconds`` and ``dedup.key`` (docs/dedup.md).

A topic's attributes are a string map in its config (``TopicConfig.attributes``, persisted in
``topics.json``).  Operators change them with UPDATE_AND_CREATE_TOPIC's ``attributes`` field
(``mqadmin updateTopic -a``), RocketMQ's modification syntax ``+key=value`` (add or change) and
``-key`` (remove), comma-separated (``AttributeParser``); the broker applies a modification to
the topic's current attributes with ``AttributeUtil``'s rules (only ``+`` when the topic is
created, no unknown keys, values from the attribute's set).

``message.type`` (``TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE``) says which messages a topic
takes: NORMAL (a topic without the attribute), FIFO, DELAY, TRANSACTION, or MIXED (all).  RocketMQ
5's proxy refuses a message of another type (``enableTopicMessageTypeCheck``); its broker does
not check the 4.x remoting sends it takes directly.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from tidemq.errors import TidemqError

__all__ = [
    "DEDUP_KEY",
    "DEDUP_WINDOW",
    "MESSAGE_TYPE",
    "TopicAttributeError",
    "TopicMessageType",
    "accepted_types",
    "alter_attributes",
    "message_type_of",
    "modification_string",
    "parse_modification",
    "type_conflict",
    "topic_message_type",
]

#: The attribute's name (TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE).
MESSAGE_TYPE = "message.type"
#: RocketMQ's message properties that make a message of a type (MessageConst).
_TRANSACTION_PREPARED = "TRAN_MSG"
_DELAY_PROPERTIES = ("DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
_SHARDING_KEY = "__SHARDINGKEY"


class TopicMessageType(enum.StrEnum):
    """RocketMQ 5's ``TopicMessageType`` (the values are what the attribute holds)."""

    UNSPECIFIED = "UNSPECIFIED"
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


#: The duplicate window's attributes (tidemq's own; docs/dedup.md): seconds a topic's keys are
#: kept (0 turns the window off for the topic), and what the key is (``uniq_key`` or ``content``).
DEDUP_WINDOW = "dedup.window.seconds"
DEDUP_KEY = "dedup.key"
#: The longest window an attribute may ask for (a day, as ``[broker] dedup_window_s``).
_DEDUP_WINDOW_MAX = 86_400

#: The attributes a topic may carry: name -> (values allowed, changeable after creation).
_KNOWN: dict[str, tuple[frozenset[str], bool]] = {
    MESSAGE_TYPE: (frozenset(TopicMessageType), True),
    DEDUP_KEY: (frozenset({"uniq_key", "content"}), True),
}
#: Attributes whose value is a whole number in a range: name -> (lowest, highest, changeable).
_RANGES: dict[str, tuple[int, int, bool]] = {DEDUP_WINDOW: (0, _DEDUP_WINDOW_MAX, True)}


def _rule(name: str) -> tuple[frozenset[str] | tuple[int, int], bool] | None:
    """What ``name``'s values may be, and whether it may change after creation; None: unknown."""
    known = _KNOWN.get(name)
    if known is not None:
        return known
    ranged = _RANGES.get(name)
    return None if ranged is None else ((ranged[0], ranged[1]), ranged[2])


def _allowed(allowed: frozenset[str] | tuple[int, int], value: str) -> bool:
    if isinstance(allowed, frozenset):
        return value in allowed
    return value.isdigit() and allowed[0] <= int(value) <= allowed[1]


def _described(allowed: frozenset[str] | tuple[int, int]) -> str:
    if isinstance(allowed, frozenset):
        return f"value is not in set: {sorted(allowed)}"
    return f"value is not an integer in [{allowed[0]}, {allowed[1]}]"


class TopicAttributeError(TidemqError, ValueError):
    """A modification that is malformed or not allowed; ``str()`` says why, as RocketMQ does."""


def parse_modification(text: str | None) -> dict[str, str]:
    """``+k=v,-k2`` as ``{"+k": "v", "-k2": ""}`` (AttributeParser.parseToMap)."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            if not key.startswith("+"):
                raise TopicAttributeError(f"add/alter attribute format is wrong: {key}")
        elif not key.startswith("-"):
            raise TopicAttributeError(f"delete attribute format is wrong: {key}")
        if key in out:
            raise TopicAttributeError(f"key duplication: {key}")
        out[key] = value
    return out


def modification_string(attributes: Mapping[str, str]) -> str:
    """The inverse of :func:`parse_modification` (AttributeParser.parseToString)."""
    return ",".join(f"{k}={v}" if v else k for k, v in attributes.items())


def alter_attributes(
    create: bool, current: Mapping[str, str], modification: Mapping[str, str]
) -> dict[str, str]:
    """The attributes after ``modification`` (AttributeUtil.alterCurrentAttributes)."""
    final = dict(current)
    seen: set[str] = set()
    for key, value in modification.items():
        name = key[1:]
        if not name or "+" in name or "-" in name:
            raise TopicAttributeError("kv string format wrong.")
        if name in seen:
            raise TopicAttributeError(f"alter duplication key. key: {name}")
        seen.add(name)
        known = _rule(name)
        if known is None:
            raise TopicAttributeError(f"unsupported key: {name}")
        allowed, changeable = known
        if key.startswith("+"):
            if not create and name in current and not changeable:
                raise TopicAttributeError(f"attempt to update an unchangeable attribute. key: {name}")
            if not _allowed(allowed, value):
                raise TopicAttributeError(_described(allowed))
            final[name] = value
        elif create:
            raise TopicAttributeError(f"only add attribute is supported while creating topic. key: {name}")
        elif key.startswith("-"):
            if name not in current:
                raise TopicAttributeError(f"attempt to delete a nonexistent key: {name}")
            if not changeable:
                raise TopicAttributeError(f"attempt to update an unchangeable attribute. key: {name}")
            final.pop(name)
        else:
            raise TopicAttributeError(f"wrong format key: {name}")
    return final


def topic_message_type(attributes: Mapping[str, str] | None) -> TopicMessageType:
    """The type a topic takes: NORMAL without the attribute (TopicConfig.getTopicMessageType)."""
    value = (attributes or {}).get(MESSAGE_TYPE)
    if value is None:
        return TopicMessageType.NORMAL
    try:
        return TopicMessageType(value)
    except ValueError:  # written by hand into topics.json: treat as RocketMQ treats no attribute
        return TopicMessageType.NORMAL


def message_type_of(properties: Mapping[str, str]) -> TopicMessageType:
    """A message's type from its properties (TopicMessageType.parseFromMessageProperty)."""
    if properties.get(_TRANSACTION_PREPARED) == "true":
        return TopicMessageType.TRANSACTION
    if any(properties.get(p) is not None for p in _DELAY_PROPERTIES):
        return TopicMessageType.DELAY
    if properties.get(_SHARDING_KEY) is not None:
        return TopicMessageType.FIFO
    return TopicMessageType.NORMAL


def type_conflict(expected: TopicMessageType, actual: TopicMessageType) -> str | None:
    """Why a message of type ``actual`` may not go to a topic of type ``expected`` (None: it may),
    in the words of RocketMQ's DefaultTopicMessageTypeValidator."""
    if actual is TopicMessageType.UNSPECIFIED or (
        actual is not expected and expected is not TopicMessageType.MIXED
    ):
        return (
            f"TopicMessageType validate failed, the expected type is {expected.value}, "
            f"but actual type is {actual.value}"
        )
    return None


def accepted_types(expected: TopicMessageType) -> tuple[TopicMessageType, ...]:
    """The message types a topic of type ``expected`` takes (what QueryRoute announces)."""
    if expected is TopicMessageType.MIXED:
        return (
            TopicMessageType.NORMAL,
            TopicMessageType.FIFO,
            TopicMessageType.DELAY,
            TopicMessageType.TRANSACTION,
        )
    return (expected,)
