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
        #: Bytes ``[_lo, _hi)`` written since the last flush (``_lo >= _hi``: none).  Only the
        #: thread that puts reads and resets them (the event loop's: :meth:`take_dirty`, then
        #: :meth:`sync` in a worker), so no put is missed and a put costs no lock.
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
        self._lo, self._hi = 0, len(self._map)

    def dirty_range(self) -> tuple[int, int] | None:
        """(offset, length) the next flush msyncs: the pages of the slots written since the last
        one, page-aligned; None when none was."""
        if self._lo >= self._hi:
            return None
        start = self._lo - self._lo % PAGE
        return start, min(self._hi - start + (-self._hi) % PAGE, len(self._map) - start)

    def take_dirty(self) -> tuple[int, int] | None:
        """:meth:`dirty_range`, the written bytes then counted as flushed (call it where the puts
        are made; hand the range to :meth:`sync`, and to :meth:`mark_dirty` if that fails)."""
        pages = self.dirty_range()
        self._lo, self._hi = len(self._map), 0
        return pages

    def mark_dirty(self, pages: tuple[int, int] | None) -> None:
        """A range taken but not synced: the next flush covers it again."""
        if pages is not None:
            self._lo = min(self._lo, pages[0])
            self._hi = max(self._hi, pages[0] + pages[1])

    def sync(self, pages: tuple[int, int] | None) -> None:
        """``msync`` a range from :meth:`take_dirty` (any thread); nothing for None."""
        if pages is not None:
            self._map.flush(*pages)

    def flush(self) -> None:
        """Make the slots written since the last flush durable (one ``msync`` of their pages)."""
        pages = self.take_dirty()
        try:
            self.sync(pages)
        except BaseException:
            self.mark_dirty(pages)
            raise

    def close(self) -> None:
        if not self._map.closed:
            self.flush()
            self._map.close()
