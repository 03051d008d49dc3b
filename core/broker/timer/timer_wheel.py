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

A flush makes durable only what changed since the last one: :meth:`TimerWheel.put` notes the
lowest and highest byte it wrote, and :meth:`TimerWheel.flush` syncs those pages with one ``msync``
(none when nothing changed).  The kernel writes back only dirty pages in any case, but an
``msync`` of a clean wheel still costs a journal wait and a device cache flush every interval.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from tidemq.errors import StoreError

SLOT = struct.Struct(">qqqii")
SLOT_SIZE = SLOT.size
SLOT_MAGIC = 0x57484C53  # "WHLS"
#: ``mmap.flush`` wants a page-aligned offset.
PAGE = mmap.PAGESIZE


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
        #: Bytes ``[_lo, _hi)`` written since the last flush (``_lo >= _hi``: none).  Written by
        #: the event loop's puts, taken by a flush in a worker thread: under ``_lock``.
        self._lock = threading.Lock()
        self._lo = size
        self._hi = 0

    def get(self, tick: int) -> Slot | None:
        """The slot ``tick`` maps to, when it was last used for ``tick`` or later ticks' chain."""
        tick_of, first, last, num, magic = SLOT.unpack_from(self._map, (tick % self.slots) * SLOT_SIZE)
        if magic != SLOT_MAGIC:
            return None
        return Slot(tick_of, first, last, num)

    def put(self, tick: int, first_pos: int, last_pos: int, num: int) -> None:
        at = (tick % self.slots) * SLOT_SIZE
        SLOT.pack_into(self._map, at, tick, first_pos, last_pos, num, SLOT_MAGIC)
        # Noted after the write: a flush that takes the note msyncs the bytes already there.
        with self._lock:
            if at < self._lo:
                self._lo = at
            if at + SLOT_SIZE > self._hi:
                self._hi = at + SLOT_SIZE

    def ticks_and_counts(self) -> Iterator[tuple[int, int]]:
        """(tick, num) of every used slot."""
        for tick_of, _first, _last, num, magic in SLOT.iter_unpack(self._map):
            if magic == SLOT_MAGIC and num:
                yield tick_of, num

    def clear(self) -> None:
        self._map[:] = bytes(len(self._map))
        with self._lock:
            self._lo, self._hi = 0, len(self._map)

    def dirty_range(self) -> tuple[int, int] | None:
        """(offset, length) the next :meth:`flush` msyncs: the pages of the slots written since the
        last flush, page-aligned; None when none was."""
        with self._lock:
            lo, hi = self._lo, self._hi
        if lo >= hi:
            return None
        start = lo - lo % PAGE
        return start, min(hi - start + (-hi) % PAGE, len(self._map) - start)

    def flush(self) -> None:
        """Make the slots written since the last flush durable (one ``msync`` of their pages)."""
        with self._lock:
            lo, hi = self._lo, self._hi
            self._lo, self._hi = len(self._map), 0
        if lo >= hi:
            return
        start = lo - lo % PAGE
        try:
            self._map.flush(start, min(hi - start + (-hi) % PAGE, len(self._map) - start))
        except BaseException:
            with self._lock:  # not durable: the next flush tries these bytes again
                self._lo, self._hi = min(self._lo, lo), max(self._hi, hi)
            raise

    def close(self) -> None:
        if not self._map.closed:
            self.flush()
            self._map.close()
