"""Load and recovery: the schedule as it was, from the files and the checkpoint.

After a SIGKILL at any moment: records written after the checkpoint are re-linked if their slot
update was cut off, the enqueue continues after the highest queue offset in the log (nothing is
logged twice), records already due are returned to be delivered again, and the delivery resumes at
the checkpoint's tick.  A wheel that is new or of another geometry is rebuilt from the log.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tidemq.broker.timer.checkpoint import TimerCheckpoint
from tidemq.broker.timer.schedule import TimerSchedule, now_ms
from tidemq.broker.timer.timer_log import RECORD_SIZE, TimerLog, TimerLogRecord
from tidemq.broker.timer.timer_wheel import TimerWheel

log = logging.getLogger(__name__)


def load(
    schedule: TimerSchedule, log_dir: Path, wheel_path: Path, checkpoint_path: Path, flush_interval_ms: int
) -> list[TimerLogRecord]:
    """Open the files into ``schedule`` and recover from the checkpoint (before the store starts);
    the records due before the crash to deliver again."""
    s = schedule
    s.log = TimerLog(log_dir)
    s.wheel = TimerWheel(wheel_path, s.slots)
    now_tick = now_ms() // s.precision_ms
    cp = TimerCheckpoint.load(checkpoint_path)
    if cp is None and s.log.end:
        # The log without its checkpoint: which records went out is unknown.  Everything due
        # within the longest delay is delivered again rather than anything lost.
        log.warning(
            "%s missing: timer messages due since %d s ago are delivered again",
            checkpoint_path,
            s.max_delay_sec,
        )
        cp = TimerCheckpoint((now_tick - s.slots // 2) * s.precision_ms, 0, 0, 0, 0)
    elif cp is None:
        cp = TimerCheckpoint(now_tick * s.precision_ms, 0, 0, s.precision_ms, s.slots)
    s.done_tick = cp.last_read_time_ms // s.precision_ms
    # The checkpoint was written (or, unchanged while messages waited, its mtime brought forward:
    # CheckpointWriter.touch) at most a flush interval before the broker stopped, or before its
    # last delivery (TimerMessageStore._mark_current: an idle stretch's file is touched before
    # the deliveries that end it): what was due until then may have gone out already, and is
    # delivered again (counted).
    try:
        written_ms = int(checkpoint_path.stat().st_mtime * 1000)
    except OSError:
        written_ms = now_ms()
    s.repeat_before_ms = max(cp.last_read_time_ms, written_ms) + flush_interval_ms + s.precision_ms
    s.queue_offset = cp.last_timer_queue_offset
    s.timing = {topic: n for topic, n in cp.timing_count.items() if n > 0}
    redeliver: list[TimerLogRecord] = []
    if s.wheel.fresh or cp.precision_ms != s.precision_ms or cp.slots != s.slots:
        rebuild_wheel(s)
    else:
        redeliver = recover_tail(s, cp.last_timer_log_flush_pos)
    s.claimed_tick = s.done_tick - 1
    s.pending = s.count_pending()
    log.info(
        "timer: %d log records, %d pending, enqueue from queue offset %d, deliver from %d ms, %d to re-deliver",
        s.log.end // RECORD_SIZE,
        s.pending,
        s.queue_offset,
        s.done_tick * s.precision_ms,
        len(redeliver),
    )
    return redeliver


def recover_tail(schedule: TimerSchedule, settled_pos: int) -> list[TimerLogRecord]:
    """Records after ``settled_pos``: re-link the one whose slot update a crash cut off, find the
    enqueue progress; those already due are returned, to deliver again."""
    s = schedule
    log_, wheel = s.files()
    redeliver: list[TimerLogRecord] = []
    for rec in log_.scan(settled_pos):
        tick = rec.due_ms // s.precision_ms
        s.queue_offset = max(s.queue_offset, rec.queue_offset + 1)
        if tick < s.done_tick:
            redeliver.append(rec)
            continue
        slot = wheel.get(tick)
        if slot is None or not slot.num or slot.last_pos < rec.pos:
            s.relink(rec, tick)
    return redeliver


def rebuild_wheel(schedule: TimerSchedule) -> None:
    """A new or re-shaped wheel: chain every record not yet delivered again."""
    s = schedule
    log_, wheel = s.files()
    wheel.clear()
    for rec in log_.scan(0):
        s.queue_offset = max(s.queue_offset, rec.queue_offset + 1)
        tick = rec.due_ms // s.precision_ms
        if tick >= s.done_tick:
            s.relink(rec, tick)
    # A new data directory makes an empty wheel too: only a rebuild over records is news.
    log.log(
        logging.WARNING if log_.end else logging.INFO,
        "timer wheel rebuilt from the timer log (%d slots of %d ms)",
        s.slots,
        s.precision_ms,
    )
