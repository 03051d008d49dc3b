"""TimerWheel: one slot per tick of ``timerPrecisionMs``, in a memory-mapped file (RocketMQ's ``TimerWheel``).

Slot ``tick % slots`` holds the tick it was last used for and the first and last TimerLog
positions of its records and their count.  ``slots`` covers twice ``timerMaxDelaySec``, so a slot
is reused only after its earlier tick is long delivered.

Slot layout (32 bytes, big-endian)::

    tick        int64   deliver_ms // precision of its records (-1: never used)
    first_pos   int64   TimerLog position of its first record
    last_pos    int64   of its last record (the walk starts here and follows prev_pos)
    num         int32   records chained
    magic       int32   SLOT_MAGIC
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from tidemq.errors import StoreError

SLOT = struct.Struct(">qqqii")
SLOT_SIZE = SLOT.size
SLOT_MAGIC = 0x57484C53  # "WHLS"


class Slot:
    __slots__ = ("first_pos", "last_pos", "num", "tick")

    def __init__(self, tick: int, first_pos: int, last_pos: int, num: int) -> None:
        self.tick = tick
        self.first_pos = first_pos
        self.last_pos = last_pos
        self.num = num


class TimerWheel:
    """The slots file, mapped; reads and writes are plain memory accesses."""

    def __init__(self, path: Path, slots: int) -> None:
        self.path = path
        self.slots = slots
        path.parent.mkdir(parents=True, exist_ok=True)
        size = slots * SLOT_SIZE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            #: False when the file was made now or had another geometry (the log rebuilds it).
            self.fresh = os.fstat(fd).st_size != size
            if self.fresh:
                os.ftruncate(fd, 0)
            # Every block reserved before the file is mapped: a write into a hole of a sparse
            # mapping on a full disk is a SIGBUS that kills the process, not an error.
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                raise StoreError(
                    f"cannot reserve the timer wheel {path} ({size} bytes, "
                    f"{slots} slots): {exc.strerror or exc}; free disk space, or lower "
                    "timer_max_delay_sec or raise timer_precision_ms (the wheel holds "
                    "2 x timer_max_delay_sec / timer_precision_ms slots of 32 bytes)"
                ) from None
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def get(self, tick: int) -> Slot | None:
        """The slot ``tick`` maps to, when it was last used for ``tick`` or later ticks' chain."""
        tick_of, first, last, num, magic = SLOT.unpack_from(self._map, (tick % self.slots) * SLOT_SIZE)
        if magic != SLOT_MAGIC:
            return None
        return Slot(tick_of, first, last, num)

    def put(self, tick: int, first_pos: int, last_pos: int, num: int) -> None:
        SLOT.pack_into(self._map, (tick % self.slots) * SLOT_SIZE, tick, first_pos, last_pos, num, SLOT_MAGIC)

    def ticks_and_counts(self) -> Iterator[tuple[int, int]]:
        """(tick, num) of every used slot."""
        for tick_of, _first, _last, num, magic in SLOT.iter_unpack(self._map):
            if magic == SLOT_MAGIC and num:
                yield tick_of, num

    def clear(self) -> None:
        self._map[:] = bytes(len(self._map))

    def flush(self) -> None:
        self._map.flush()

    def close(self) -> None:
        if not self._map.closed:
            self._map.flush()
            self._map.close()
