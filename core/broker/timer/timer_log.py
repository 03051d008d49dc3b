"""TimerLog: the append-only records of timer messages, in fixed-size files (RocketMQ's ``TimerLog``).

One fixed-size record per message parked in ``rmq_sys_wheel_timer``, in the order the enqueue
service read them.  A record chains to the previous record of its wheel slot (``prev_pos``), so a
slot's messages are found by walking back from the slot's last record, never by a scan.

The log is a directory of files of :data:`FILE_SIZE` bytes named by the position of their first
record (``00000000000000000000``, ``00000000000050331648``...), as RocketMQ names its mapped files;
files whose records are all delivered are deleted (:meth:`TimerLog.delete_before`).

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
#: Bytes per file: 1 Mi records (48 MiB).
FILE_SIZE = RECORD_SIZE * (1 << 20)


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
    """The record files: appended with ``pwrite`` at the end, read with ``pread``."""

    def __init__(self, directory: Path, file_size: int = FILE_SIZE) -> None:
        if file_size % RECORD_SIZE:
            raise ValueError(f"timer log file size {file_size} is not a multiple of {RECORD_SIZE}")
        self.directory = directory
        self.file_size = file_size
        directory.mkdir(parents=True, exist_ok=True)
        self._fds: dict[int, int] = {}  # file start -> fd, in order
        self._dirty: set[int] = set()
        starts = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for start in starts:
            self._fds[start] = os.open(directory / f"{start:020d}", os.O_RDWR)
        self.end = 0
        if starts:
            last = starts[-1]
            size = os.fstat(self._fds[last]).st_size
            whole = min(size - size % RECORD_SIZE, file_size)
            if whole != size:  # a record cut short (only a power loss can do that): dropped
                os.ftruncate(self._fds[last], whole)
            self.end = last + whole

    @property
    def start(self) -> int:
        """Position of the first record kept."""
        return next(iter(self._fds), self.end)

    def _fd(self, pos: int, create: bool = False) -> int | None:
        start = pos - pos % self.file_size
        fd = self._fds.get(start)
        if fd is None and create:
            fd = self._fds[start] = os.open(self.directory / f"{start:020d}", os.O_RDWR | os.O_CREAT, 0o600)
        return fd

    def append(
        self, size: int, prev_pos: int, due_ms: int, deliver_ms: int, phy_offset: int, queue_offset: int
    ) -> int:
        """Write one record at the end; its position."""
        pos = self.end
        fd = self._fd(pos, create=True)
        assert fd is not None
        data = RECORD.pack(RECORD_MAGIC, size, prev_pos, due_ms, deliver_ms, phy_offset, queue_offset)
        os.pwrite(fd, data, pos % self.file_size)  # one write(2): a SIGKILL leaves it whole or absent
        self._dirty.add(fd)
        self.end = pos + RECORD_SIZE
        return pos

    def set_prev(self, pos: int, prev_pos: int) -> None:
        """Re-chain a record (recovery and rebuild only)."""
        fd = self._fd(pos)
        if fd is not None:
            os.pwrite(fd, struct.pack(">q", prev_pos), pos % self.file_size + 8)
            self._dirty.add(fd)

    def read(self, pos: int) -> TimerLogRecord | None:
        """The record at ``pos``; None past the end, in a deleted file, or not a record."""
        fd = self._fd(pos)
        if fd is None or pos >= self.end:
            return None
        data = os.pread(fd, RECORD_SIZE, pos % self.file_size)
        if len(data) < RECORD_SIZE:
            return None
        magic, size, prev_pos, due_ms, deliver_ms, phy, qoff = RECORD.unpack(data)
        if magic != RECORD_MAGIC:
            return None
        return TimerLogRecord(pos, size, prev_pos, due_ms, deliver_ms, phy, qoff)

    def scan(self, start: int) -> Iterator[TimerLogRecord]:
        """Records from ``start`` to the end, in order (recovery: the tail after the checkpoint)."""
        pos = max(self.start, start - start % RECORD_SIZE)
        chunk = RECORD_SIZE * 4096
        while pos < self.end:
            fd = self._fd(pos)
            if fd is None:  # a gap between files: go on at the next one
                later = [s for s in self._fds if s > pos]
                if not later:
                    return
                pos = later[0]
                continue
            in_file = pos % self.file_size
            want = min(chunk, self.end - pos, self.file_size - in_file)
            data = os.pread(fd, want, in_file)
            if not data:
                return
            for i in range(0, len(data) - RECORD_SIZE + 1, RECORD_SIZE):
                magic, size, prev_pos, due_ms, deliver_ms, phy, qoff = RECORD.unpack_from(data, i)
                if magic == RECORD_MAGIC:
                    yield TimerLogRecord(pos + i, size, prev_pos, due_ms, deliver_ms, phy, qoff)
            pos += len(data) - len(data) % RECORD_SIZE

    def files(self) -> list[tuple[int, Path]]:
        """(first position, path) of every file, oldest first."""
        return [(start, self.directory / f"{start:020d}") for start in self._fds]

    def delete_before(self, pos: int, older_than_s: float) -> int:
        """Delete the files that end at or before ``pos`` and were last written before
        ``older_than_s`` (epoch seconds); never the file being appended to.  How many went."""
        deleted = 0
        current = self.end - self.end % self.file_size
        for start, path in self.files():
            if start + self.file_size > pos or start >= current:
                break
            fd = self._fds[start]
            if os.fstat(fd).st_mtime >= older_than_s:
                break
            os.close(fd)
            del self._fds[start]
            self._dirty.discard(fd)
            path.unlink(missing_ok=True)
            deleted += 1
        return deleted

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for fd in dirty:
            os.fdatasync(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dirty.clear()

    def size_bytes(self) -> int:
        return sum(os.fstat(fd).st_size for fd in self._fds.values())
