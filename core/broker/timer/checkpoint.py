"""TimerCheckpoint: how far the timer service got, in ``config/timercheck`` (RocketMQ's ``TimerCheckpoint``).

Written atomically (temp file, fsync, rename) every ``timer_flush_interval_ms``, after the
TimerLog and the wheel were flushed.  The keys are RocketMQ's:

* ``lastReadTimeMs``: every tick before it is delivered (the dequeue progress);
* ``lastTimerLogFlushPos``: every TimerLog record before it is settled (enqueued, and delivered
  when it was already due);
* ``lastTimerQueueOffset``: rmq_sys_wheel_timer queue offsets before it are in the TimerLog;
* ``precisionMs`` / ``slots``: the wheel's geometry (another one rebuilds the wheel from the log);
* ``timingCount``: messages waiting per real topic (GET_TIMER_METRICS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import orjson

from tidemq.errors import CorruptDataError
from tidemq.jsonfile import atomic_write_bytes


@attrs.define
class TimerCheckpoint:
    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    precision_ms: int = 0
    slots: int = 0
    #: real topic -> messages waiting (RocketMQ keeps it in ``timermetrics``).
    timing_count: dict[str, int] = attrs.field(factory=dict)

    @classmethod
    def load(cls, path: Path) -> TimerCheckpoint | None:
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise CorruptDataError(
                f"{path} is not a timer checkpoint ({exc}); restore it or move it away"
            ) from exc
        try:
            return cls(
                int(data["lastReadTimeMs"]),
                int(data["lastTimerLogFlushPos"]),
                int(data["lastTimerQueueOffset"]),
                int(data.get("precisionMs", 0)),
                int(data.get("slots", 0)),
                {str(k): int(v) for k, v in dict(data.get("timingCount", {})).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(
                f"{path} is not a timer checkpoint ({exc}); restore it or move it away"
            ) from exc

    def to_json(self) -> dict[str, Any]:
        return {
            "lastReadTimeMs": self.last_read_time_ms,
            "lastTimerLogFlushPos": self.last_timer_log_flush_pos,
            "lastTimerQueueOffset": self.last_timer_queue_offset,
            "masterTimerQueueOffset": self.last_timer_queue_offset,
            "precisionMs": self.precision_ms,
            "slots": self.slots,
            "timingCount": self.timing_count,
        }

    def save(self, path: Path) -> None:
        atomic_write_bytes(path, orjson.dumps(self.to_json()))
