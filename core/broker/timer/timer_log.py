"""TimerLog: the append-only file of timer records (RocketMQ's ``TimerLog``, one file).

One fixed-size record per message parked in ``rmq_sys_wheel_timer``, in the order the enqueue
service read them.  A record chains to the previous record of its wheel slot (``prev_pos``), so a
slot's messages are found by walking back from the slot's last record, never by a scan.

Record layout (48 bytes, big-endian)::

    magic       int32   RECORD_MAGIC
    size        int32   the message's record size in the commit log
    prev_pos    int64   the slot's previous record (-1: none)
    due_ms      int64   when the wheel acts on it (its slot's time)
    deliver_ms  int64   when the message is due (epoch ms, TIMER_OUT_MS); later than ``due_ms``
                        for a message rolled: put back into rmq_sys_wheel_timer at ``due_ms``
    phy_offset  int64   the message's commit-log offset
    queue_off   int64   its offset in rmq_sys_wheel_timer queue 0 (recovery finds its progress here)
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

RECORD = struct.Struct(">iiqqqqq")
RECORD_SIZE = RECORD.size
RECORD_MAGIC = 0x54494D52  # "TIMR"
#: ``prev_pos`` of a slot's first record.
NO_RECORD = -1


class TimerLogRecord:
    """One decoded record (built only while walking a due slot or recovering)."""

    __slots__ = ("deliver_ms", "due_ms", "phy_offset", "pos", "prev_pos", "queue_offset", "size")

    def __init__(
        self,
        pos: int,
        size: int,
        prev_pos: int,
        due_ms: int,
        deliver_ms: int,
        phy_offset: int,
        queue_offset: int,
    ) -> None:
        self.pos = pos
        self.size = size
        self.prev_pos = prev_pos
        self.due_ms = due_ms
        self.deliver_ms = deliver_ms
        self.phy_offset = phy_offset
        self.queue_offset = queue_offset


class TimerLog:
    """The records file: appended with ``pwrite`` at its end, read with ``pread``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        end = os.fstat(self._fd).st_size
        whole = end - end % RECORD_SIZE
        if whole != end:  # a record cut short (only a power loss can do that): dropped
            os.ftruncate(self._fd, whole)
        self.end = whole

    def append(
        self, size: int, prev_pos: int, due_ms: int, deliver_ms: int, phy_offset: int, queue_offset: int
    ) -> int:
        """Write one record at the end; its position."""
        pos = self.end
        data = RECORD.pack(RECORD_MAGIC, size, prev_pos, due_ms, deliver_ms, phy_offset, queue_offset)
        os.pwrite(self._fd, data, pos)  # one write(2): a SIGKILL leaves it whole or absent
        self.end = pos + RECORD_SIZE
        return pos

    def set_prev(self, pos: int, prev_pos: int) -> None:
        """Re-chain a record (recovery and rebuild only)."""
        os.pwrite(self._fd, struct.pack(">q", prev_pos), pos + 8)

    def read(self, pos: int) -> TimerLogRecord | None:
        data = os.pread(self._fd, RECORD_SIZE, pos)
        if len(data) < RECORD_SIZE:
            return None
        magic, size, prev_pos, due_ms, deliver_ms, phy, qoff = RECORD.unpack(data)
        if magic != RECORD_MAGIC:
            return None
        return TimerLogRecord(pos, size, prev_pos, due_ms, deliver_ms, phy, qoff)

    def scan(self, start: int) -> Iterator[TimerLogRecord]:
        """Records from ``start`` to the end, in order (recovery: the tail after the checkpoint)."""
        pos = max(0, start - start % RECORD_SIZE)
        chunk = RECORD_SIZE * 4096
        while pos < self.end:
            data = os.pread(self._fd, min(chunk, self.end - pos), pos)
            if not data:
                return
            for i in range(0, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
                magic, size, prev_pos, due_ms, deliver_ms, phy, qoff = RECORD.unpack_from(data, i)
                if magic == RECORD_MAGIC:
                    yield TimerLogRecord(pos + i, size, prev_pos, due_ms, deliver_ms, phy, qoff)
            pos += len(data) - len(data) % RECORD_SIZE

    def flush(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
