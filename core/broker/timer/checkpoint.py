"""TimerCheckpoint: how far the timer service got, in ``config/timercheck`` (RocketMQ's ``TimerCheckpoint``).

Written atomically (temp file, fsync, rename, directory fsync) every ``timer_flush_interval_ms``,
after the TimerLog and the wheel were flushed; not when nothing changed but the read time
(:class:`CheckpointWriter`: idle, nothing waiting; or holding, the same messages waiting and
nothing new in the log since the last write), then only every :data:`IDLE_REWRITE_S`.  It is JSON of varying length, so it is never rewritten in place.  The keys
are RocketMQ's:

* ``lastReadTimeMs``: every tick before it is delivered (the dequeue progress);
* ``lastTimerLogFlushPos``: every TimerLog record before it is settled (enqueued, and delivered
  when it was already due);
* ``lastTimerQueueOffset``: rmq_sys_wheel_timer queue offsets before it are in the TimerLog;
* ``precisionMs`` / ``slots``: the wheel's geometry (another one rebuilds the wheel from the log);
* ``timingCount``: messages waiting per real topic (GET_TIMER_METRICS).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import attrs
import orjson

from tidemq.errors import CorruptDataError
from tidemq.jsonfile import atomic_write_bytes

#: An idle timer service's checkpoint is rewritten this often (seconds) at most: only its
#: ``lastReadTimeMs`` moves then, and a restart walks the empty ticks since the one on disk.
IDLE_REWRITE_S = 60.0


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


class CheckpointWriter:
    """Decides when the checkpoint is written: at every flush interval while the service changes,
    and only every :data:`IDLE_REWRITE_S` while only its read time moves.

    Unchanged: the log position, queue offset, wheel geometry, messages waiting (``waiting``, the
    schedule's pending count) and per-topic timing counts all as at the last write.  Then no record
    entered the log or left the wheel since (an enqueue moves the log, a delivery, roll or recall
    lowers the waiting count), so the ticks walked since held nothing: a restart from the older
    checkpoint walks them again and delivers nothing again.  Two cases:

    * idle, nothing waiting at all: an idle broker makes no timer ``fsync`` (it was two a second:
      temp file and directory, each a journal commit on the store's disk);
    * holding, messages waiting but none due, none new: no ``fsync`` either, but the file's
      mtime is brought forward (:meth:`touch`, one ``utime``, no data written) at every interval.
      Recovery reads the mtime as "the state on disk was current then": what went out after it
      (the next change is written within an interval) is counted as a possible re-delivery
      (``timerRecoveredRedeliveries``) exactly as when the file was rewritten every interval.

    Idle, the file is left as it is, its mtime too, which may then be up to ``idle_rewrite_s``
    old when new timer messages come and are delivered before the next interval writes it: the
    delivery brings the mtime forward first (:meth:`stale`, :meth:`touch`; one ``utime`` per
    half interval at most, only while delivering), so a repeat after a SIGKILL is counted then too.
    """

    def __init__(self, path: Path, idle_rewrite_s: float = IDLE_REWRITE_S) -> None:
        self.path = path
        self.idle_rewrite_s = idle_rewrite_s
        self._last: TimerCheckpoint | None = None
        self._last_waiting = -1
        self._last_at = 0.0
        self._current_at = 0.0  # the file's last write or touch (monotonic)

    def unchanged(self, cp: TimerCheckpoint, waiting: int) -> bool:
        """Whether only the read time moved since the last write (see the class)."""
        last = self._last
        return (
            last is not None
            and waiting == self._last_waiting
            and cp.timing_count == last.timing_count
            and cp.last_timer_log_flush_pos == last.last_timer_log_flush_pos
            and cp.last_timer_queue_offset == last.last_timer_queue_offset
            and (cp.precision_ms, cp.slots) == (last.precision_ms, last.slots)
            and cp.last_read_time_ms >= last.last_read_time_ms
        )

    def needed(self, cp: TimerCheckpoint, waiting: int, now: float | None = None) -> bool:
        """Whether ``cp`` has to be written (the log and the wheel flushed before it)."""
        last = self._last
        if last is None:
            return True
        if cp == last:
            return False
        if not self.unchanged(cp, waiting):
            return True
        return (time.monotonic() if now is None else now) - self._last_at >= self.idle_rewrite_s

    def save(self, cp: TimerCheckpoint, waiting: int, now: float | None = None) -> None:
        """Write ``cp`` (atomically) and remember it."""
        at = time.monotonic() if now is None else now  # before: the file's mtime is not older
        cp.save(self.path)
        self._last = attrs.evolve(cp, timing_count=dict(cp.timing_count))
        self._last_waiting = waiting
        self._last_at = self._current_at = at

    def stale(self, max_age_s: float, now: float | None = None) -> bool:
        """Whether the file was neither written nor touched in the last ``max_age_s`` seconds."""
        return (time.monotonic() if now is None else now) - self._current_at >= max_age_s

    def touch(self) -> None:
        """A skipped write while messages wait, or a delivery after an idle stretch: the file's
        mtime says its state is still current (recovery's re-delivery count starts from it).  No
        data, no ``fsync``."""
        at = time.monotonic()
        try:
            os.utime(self.path)
        except FileNotFoundError:
            return
        self._current_at = at
