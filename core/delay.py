"""Delay levels and the schedule topic (RocketMQ's ScheduleMessageService facts shared by broker and store).

A message with DELAY = n > 0 waits in ``SCHEDULE_TOPIC_XXXX`` queue ``n - 1``.  RocketMQ stores its
delivery time (store timestamp + delay of the level) as the ConsumeQueue tags code of that queue,
so a RocketMQ broker opening the store schedules it correctly; :func:`schedule_tags_code` computes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tidemq.errors import ConfigError
from tidemq.message import Prop

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ's messageDelayLevel default.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(spec: str) -> list[int]:
    """``"1s 5s 10s 30s 1m ... 2h"`` -> delay in milliseconds per level (level 1 first).

    Raises :class:`ConfigError` naming the bad item.
    """
    levels = []
    for item in spec.split():
        m = _LEVEL_RE.match(item.strip().lower())
        if m is None:
            raise ConfigError(
                f"[broker] delay_levels: {item!r} is not a delay like 1s, 5m, 2h (units ms s m h d)"
            )
        levels.append(int(m.group(1)) * _UNITS_MS[m.group(2)])
    if not levels:
        raise ConfigError("[broker] delay_levels: at least one level is needed")
    return levels


def delay_level_in(properties: Mapping[str, str]) -> int:
    """The DELAY property as an int (0 when absent or not a number)."""
    try:
        return int(properties.get(Prop.DELAY_TIME_LEVEL, "0") or 0)
    except ValueError:
        return 0


def schedule_tags_code(
    levels: Sequence[int], properties: Mapping[str, str], store_timestamp: int
) -> int | None:
    """The ConsumeQueue tags code RocketMQ gives a schedule-topic record, ``None`` without a delay.

    Levels above the last count as the last (CommitLog.checkMessageAndReturnSize).
    """
    level = delay_level_in(properties)
    if level <= 0:
        return None
    return store_timestamp + levels[min(level, len(levels)) - 1]
