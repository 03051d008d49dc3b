"""The ``checkpoint`` file: how far the commit log, the consume queues and the index are on disk.

Same layout as RocketMQ's StoreCheckpoint: three big-endian longs (physicMsgTimestamp,
logicsMsgTimestamp, indexMsgTimestamp) at the start of a 4 KiB file.  Abnormal recovery starts
from the commit-log file whose first record is older than the smallest of them.
"""

from __future__ import annotations

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
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if len(data) >= _LAYOUT.size:
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = (
                _LAYOUT.unpack_from(data)
            )

    def min_timestamp(self, with_index: bool) -> int:
        ts = min(self.physic_msg_timestamp, self.logics_msg_timestamp)
        if with_index:
            ts = min(ts, self.index_msg_timestamp)
        return max(0, ts - SAFETY_MS)

    def flush(self) -> None:
        data = bytearray(FILE_SIZE)
        _LAYOUT.pack_into(
            data, 0, self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
        )
        atomic_write_bytes(self.path, bytes(data))
