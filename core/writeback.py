"""Write a file's dirty pages back early (``sync_file_range``) without making them durable.

Used by the hash index (its flush, :func:`write_back` in windows) and the mmap store's zeros ahead
(each chunk written back as it is zeroed, :func:`sync_file_range`).


An index flush after 10 s at 2 000 keys/s has ~5 000 dirty slot pages spread over the slot table.
One ``fdatasync`` queues all of them on the device at once, and a sync-flush round of the commit
log issued meanwhile waits behind them: its writes queue behind thousands, and its cache flush
makes all of them durable first (docs/flush.md, "Our own I/O behind the round").  Written back a
window at a time, each waited for before the next (``SYNC_FILE_RANGE_WAIT_BEFORE | WRITE |
WAIT_AFTER``), a round meets at most one window of ours in the device; the ``fdatasync`` that
follows finds the data clean and writes what is left (the metadata) and the cache flush.

``sync_file_range`` makes no data durable by itself (no cache flush, no metadata): it only moves
the writeback earlier, so the caller's ``fdatasync`` keeps every guarantee it gave.  Where it is
missing (not Linux), :func:`write_back` does nothing and the ``fdatasync`` writes everything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

__all__ = ["PAUSE_S", "WINDOW", "WRITE_BACK_AND_WAIT", "available", "sync_file_range", "write_back"]

_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4
#: ``SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER``: start the range's writeback and wait for it.
WRITE_BACK_AND_WAIT = _WAIT_BEFORE | _WRITE | _WAIT_AFTER


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load()

#: Bytes of the file per window (64 pages): what a commit-log round may find of ours in the device.
WINDOW = 256 * 1024
#: Pause after a window that wrote something, so rounds get the device between windows.
PAUSE_S = 0.0005
#: A window that returns faster than this had nothing dirty (no pause after it).
_CLEAN_NS = 30_000


def available() -> bool:
    """Whether ``sync_file_range`` exists here (Linux); elsewhere the callers' ``fdatasync`` writes all."""
    return _sync_file_range is not None


def sync_file_range(fd: int, offset: int, nbytes: int, flags: int = WRITE_BACK_AND_WAIT) -> bool:
    """One ``sync_file_range`` call; False when it is missing or failed (logged at debug: the
    caller's ``fdatasync`` still writes and reports)."""
    fn = _sync_file_range
    if fn is None:
        return False
    if fn(fd, offset, nbytes, flags) != 0:
        log.debug("sync_file_range failed (errno %d): left to fdatasync", ctypes.get_errno())
        return False
    return True


def write_back(
    fd: int, ranges: Iterable[tuple[int, int]], window: int = WINDOW, pause_s: float = PAUSE_S
) -> int:
    """Write back the dirty pages of ``[start, end)`` ranges of ``fd``, ``window`` bytes at a time.

    Returns the windows issued.  Errors are left to the caller's ``fdatasync`` (which reports a
    failed writeback); a failing call stops the windows.
    """
    fn = _sync_file_range
    if fn is None:
        return 0
    flags = _WAIT_BEFORE | _WRITE | _WAIT_AFTER
    windows = 0
    for start, end in ranges:
        pos = start
        while pos < end:
            n = min(window, end - pos)
            t0 = time.perf_counter_ns()
            if fn(fd, pos, n, flags) != 0:
                log.debug("sync_file_range failed (errno %d): left to fdatasync", ctypes.get_errno())
                return windows
            windows += 1
            pos += n
            if pause_s > 0 and time.perf_counter_ns() - t0 > _CLEAN_NS:
                time.sleep(pause_s)
    return windows
