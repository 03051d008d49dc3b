"""The ``checkpoint`` file: how far the commit log, the consume queues and the index are on disk.

Same layout as RocketMQ's StoreCheckpoint: three big-endian longs (physicMsgTimestamp,
logicsMsgTimestamp, indexMsgTimestamp) at the start of a 4 KiB file.  Abnormal recovery starts
from the commit-log file whose first record is older than the smallest of them.

Written as RocketMQ writes it (a mapped 4 KiB file flushed in place): once the file exists, a flush
rewrites its first 24 bytes where they are and calls ``fdatasync`` on it, a single-sector write into a
block already written, so no journal commit; a flush with nothing changed writes nothing.  The
first flush creates the file whole (temp file, ``fsync``, rename, directory ``fsync``).  Under sync
flush the old way (a new file every second, two ``fsync`` calls and two journal commits) ran beside
the commit log's ``fdatasync`` rounds on the same file system (docs/flush.md, "Sync send latency").
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from tidemq.jsonfile import atomic_write_bytes

_LAYOUT = struct.Struct(">qqq")
FILE_SIZE = 4096
#: RocketMQ backs the timestamp off by 3 s to cover clock jitter between the three writers.
SAFETY_MS = 3000


class StoreCheckpoint:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        #: The first bytes the file holds whole on disk (b"" until known): what a flush compares with.
        self._on_disk = b""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if len(data) >= _LAYOUT.size:
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = (
                _LAYOUT.unpack_from(data)
            )
        if len(data) == FILE_SIZE:
            self._on_disk = data[: _LAYOUT.size]

    def min_timestamp(self, with_index: bool) -> int:
        ts = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        if with_index:
            ts = min(ts, self.index_msg_timestamp)
        return max(0, ts - SAFETY_MS)

    def lowered(self) -> bool:
        """Whether a time is below what the file holds (a truncation lowered it): written at once,
        as the file must never claim more than is there."""
        if not self._on_disk:
            return False
        on_disk = _LAYOUT.unpack(self._on_disk)
        ours = (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp)
        return any(a < b for a, b in zip(ours, on_disk, strict=True))

    def flush(self) -> None:
        """Make the three timestamps durable: nothing when they are already, in place when the
        file is there whole, else by writing a new file."""
        head = _LAYOUT.pack(self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp)
        if head == self._on_disk:
            return
        if self._on_disk:
            try:
                fd = os.open(self.path, os.O_WRONLY)
            except FileNotFoundError:
                pass  # removed behind our back: written whole below
            else:
                try:
                    if os.pwrite(fd, head, 0) == len(head):
                        os.fdatasync(fd)
                        self._on_disk = head
                        return
                finally:
                    os.close(fd)
        atomic_write_bytes(self.path, head + bytes(FILE_SIZE - len(head)))
        self._on_disk = head
