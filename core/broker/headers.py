"""Typed access to a request's extFields, and the constants processors share."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from tidemq.errors import TidemqError

# PermName: defined in tidemq.perm, importable from here as before.
from tidemq.perm import PERM_INHERIT as PERM_INHERIT
from tidemq.perm import PERM_PRIORITY as PERM_PRIORITY
from tidemq.perm import PERM_READ as PERM_READ
from tidemq.perm import PERM_WRITE as PERM_WRITE
from tidemq.perm import is_inherited as is_inherited
from tidemq.perm import is_readable as is_readable
from tidemq.perm import is_writeable as is_writeable
from tidemq.remoting.command import stringify_fields

DEFAULT_TOPIC = "TBW102"  # AUTO_CREATE_TOPIC_KEY_TOPIC: the template a producer's first send names
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
MASTER_ID = 0


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


class HeaderFieldError(TidemqError):
    """A request header lacks a required field or holds a value of the wrong type."""


_MISSING: Any = object()


def field_str(value: Any, name: str, what: str, default: Any = _MISSING) -> str:
    """``value`` (a header field's raw value, None when absent) as a string; errors name the field."""
    if value is None:
        if default is _MISSING:
            raise HeaderFieldError(f"the {what} header lacks the field {name!r}")
        return default
    return value if type(value) is str else str(value)


def field_int(value: Any, name: str, what: str, default: Any = _MISSING) -> int:
    """``value`` as an integer; absent or empty is ``default`` (an error when there is none)."""
    if value is None or value == "":
        if default is _MISSING:
            raise HeaderFieldError(f"the {what} header lacks the field {name!r}")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise HeaderFieldError(f"the {what} header field {name!r} = {value!r} is not an integer") from None


def field_bool(value: Any, default: bool = False) -> bool:
    """``value`` as Java's ``Boolean.parseBoolean`` reads it (``"1"`` too); absent or empty is ``default``."""
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


class Header:
    """A request's extFields with typed getters; errors name the field and the request.

    The getters are :func:`field_str`, :func:`field_int` and :func:`field_bool` over the named
    field; a hot path that knows its fields calls those directly on ``ext_fields.get(...)``.
    """

    __slots__ = ("_fields", "_what")

    def __init__(self, fields: Mapping[str, Any] | None, what: str):
        self._fields = dict(fields or {})
        self._what = what

    def __contains__(self, name: str) -> bool:
        return name in self._fields and self._fields[name] is not None

    def str(self, name: str, default: Any = _MISSING) -> str:
        return field_str(self._fields.get(name), name, self._what, default)

    def int(self, name: builtins.str, default: Any = _MISSING) -> builtins.int:
        return field_int(self._fields.get(name), name, self._what, default)

    def bool(self, name: builtins.str, default: builtins.bool = False) -> builtins.bool:
        return field_bool(self._fields.get(name), default)


def kv(**values: Any) -> dict[str, str]:
    """Response extFields: RocketMQ sends every value as a string (:func:`stringify_fields`)."""
    return stringify_fields(values)
