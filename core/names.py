"""Topic and group names: RocketMQ's rules, checked wherever a name enters tidemq.

A name becomes a directory (``consumequeue/<topic>/``), a key (``topic@group`` in
consumerOffset.json) and a retry topic (``%RETRY%<group>``), so a name a peer chose must never
reach any of them unchecked: ``x/../Victim`` as a group once wrote into topic Victim's queue
directory.  The rules are RocketMQ's ``TopicValidator`` / ``Validators.checkGroup``: characters
``%|a-zA-Z0-9_-`` only (so no ``/``, ``.`` or NUL can ever form a path), topics at most 127
characters, groups at most 255.  Every check is a full match: ``re.match`` with ``$`` would accept
a trailing newline.
"""

from __future__ import annotations

import re
from pathlib import Path

from tidemq.errors import TidemqError

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
#: Names derived from a group (``%RETRY%<group>``, ``%DLQ%<group>``) may be this long.
DERIVED_MAX_LENGTH = GROUP_MAX_LENGTH + len("%RETRY%")
#: The longest file name Linux file systems take; a longer topic cannot be a directory.
PATH_COMPONENT_MAX = 255
_VALID = re.compile(r"[%|a-zA-Z0-9_-]+")
_ALLOWED = "^[%|a-zA-Z0-9_-]+$"


class InvalidNameError(TidemqError, ValueError):
    """A topic or group name breaks RocketMQ's naming rules (or would leave a data directory)."""


def _problem(kind: str, name: object, limit: int) -> str | None:
    if not isinstance(name, str):
        return f"the {kind} name must be a string, got {type(name).__name__}"
    if not name:
        return f"the {kind} name is blank"
    if len(name) > limit:
        return f"the {kind} name is longer than {limit} characters ({len(name)})"
    if _VALID.fullmatch(name) is None:
        return f"the {kind} name {_show(name)} contains characters other than {_ALLOWED}"
    return None


def _show(name: str) -> str:
    return repr(name if len(name) <= 80 else name[:77] + "...")


def check_topic_name(topic: object) -> str | None:
    """Why ``topic`` is not a valid topic name, or None (RocketMQ's TopicValidator)."""
    return _problem("topic", topic, TOPIC_MAX_LENGTH)


def check_group_name(group: object) -> str | None:
    """Why ``group`` is not a valid group name, or None (RocketMQ's Validators.checkGroup)."""
    return _problem("group", group, GROUP_MAX_LENGTH)


def check_stored_topic_name(topic: object) -> str | None:
    """Why ``topic`` cannot be stored: like a topic, but derived names (``%RETRY%<group>``) may be longer."""
    return _problem("topic", topic, DERIVED_MAX_LENGTH)


def require_topic(topic: object) -> str:
    problem = check_topic_name(topic)
    if problem:
        raise InvalidNameError(problem)
    return topic  # type: ignore[return-value]


def require_group(group: object) -> str:
    problem = check_group_name(group)
    if problem:
        raise InvalidNameError(problem)
    return group  # type: ignore[return-value]


def is_valid_topic(topic: object) -> bool:
    return check_stored_topic_name(topic) is None


def is_valid_group(group: object) -> bool:
    return check_group_name(group) is None


def topic_dir(root: Path, topic: str) -> Path:
    """``root / topic``, refused unless ``topic`` is a valid name that stays a child of ``root``.

    The one place a store turns a topic into a path.  The character rule already excludes
    ``/`` and ``.``; the resolved-parent check is defence in depth against any future change
    of the rule (and a symlinked root is resolved the same way on both sides).
    """
    problem = check_stored_topic_name(topic)
    if problem is None and len(topic.encode()) > PATH_COMPONENT_MAX:
        problem = f"the topic name is longer than the {PATH_COMPONENT_MAX}-byte file-name limit"
    if problem:
        raise InvalidNameError(f"{problem}; refused as a directory under {root}")
    path = root / topic
    if path.resolve().parent != root.resolve():
        raise InvalidNameError(f"the topic name {_show(topic)} would resolve outside {root}")
    return path


__all__ = [
    "DERIVED_MAX_LENGTH",
    "GROUP_MAX_LENGTH",
    "TOPIC_MAX_LENGTH",
    "InvalidNameError",
    "check_group_name",
    "check_stored_topic_name",
    "check_topic_name",
    "is_valid_group",
    "is_valid_topic",
    "require_group",
    "require_topic",
    "topic_dir",
]
