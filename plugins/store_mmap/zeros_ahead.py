"""The commit log's zeros ahead, written by a background thread (RocketMQ's ``warmMappedFile``).

The commit log keeps zeros written ahead of its write position (:func:`.commitlog.zero_ahead`:
the page cache then gives large folios and the records' writes only copy).  Written inline, the
256 KiB ``pwrite`` sat on the event loop whenever a write crossed the zeroed mark (up to 29.5 ms
on a busy disk), and under sync flush the next round wrote them back and converted the reserved
extents (docs/flush.md, "Sync send latency").  :class:`ZerosAhead` writes them from its own
thread, ``window`` bytes past the write position in ``chunk``-sized, chunk-aligned writes, and
under flush rounds (sync flush) ``fdatasync``\\ s them (``sync``, at most every 100 ms) so a round
only overwrites blocks already written.

Who writes where (the loop is whoever appends to the commit log, holding the store's lock):

* the thread claims ``[lo, hi)`` under the lock before zeroing it, with ``lo`` at least the
  zeroed mark and at least the end the loop last announced (:meth:`before_write`): it never
  zeroes a byte the loop has written or is about to write;
* the loop writes below the zeroed mark without a lock (the thread only claims above it); a write
  past the mark first announces its end under the lock (later claims start past it) and waits for
  a claim in progress that overlaps it; it zeroes inline itself only when it has caught up with
  the thread in the same file (counted: ``inline_writes``);
* zeros stop at the file's end; a new file (roll-over, or the first write after a start) is
  announced by the loop's first write into it; :meth:`stop` joins the thread.

Zeros read as the unwritten file does, so recovery (zeros past the last record are the end) sees
nothing new, crash or not.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from tidemq.threads import name_this_thread
from tidemq.writeback import available as can_write_back
from tidemq.writeback import sync_file_range

from .mapped_file import MappedFile

log = logging.getLogger(__name__)


# Under flush rounds each chunk is written back as soon as it is zeroed
# (``tidemq.writeback.sync_file_range``), so a round's ``fdatasync``, which waits for every page
# of the log under writeback, meets at most one chunk of zeros in flight instead of a whole fill
# (up to ``WINDOW``) written back by the thread's ``fdatasync`` at once (docs/flush.md, "Our own
# I/O behind the round").  Durability is still the ``fdatasync``'s.

#: How far the thread keeps zeros ahead of the write position.
WINDOW = 1024 * 1024
#: Chunks are written back one at a time only while the log grows slower than this (bytes/s).
WRITE_BACK_MAX_RATE = 16 * 1024 * 1024


class ZerosAhead:
    """Zeros ahead of one appender's write position, kept by a background thread."""

    def __init__(
        self,
        write: Callable[[int, int, int, int, int], int],
        chunk: int,
        window: int = WINDOW,
        *,
        background: bool = False,
        sync: bool = False,
        sync_interval_s: float = 0.1,
    ):
        #: ``zero_ahead(fd, zeroed, end, chunk, limit) -> new zeroed``.
        self._write = write
        self.chunk = chunk
        self.window = max(window, chunk)
        self.background = background
        #: fdatasync after a fill (for flush rounds: set by CommitLog.use_flush_rounds), at most
        #: once every ``sync_interval_s`` (at high rates the rounds' own syncs take the zeros).
        self.sync = sync
        self.sync_interval_s = sync_interval_s
        self._synced_at = 0.0
        self._cv = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._kicked = False
        #: The file being zeroed, the thread's own fd to it, and how far zeros (or the loop's
        #: bytes) reach: nothing below ``zeroed_to`` is written by the thread any more.
        self.mf: MappedFile | None = None
        self._fd = -1
        self._retired: list[int] = []
        self.zeroed_to = 0
        #: The end of the loop's last announced write: claims start at or past it.
        self._reserved = 0
        #: Past this write end the loop wakes the thread to refill.
        self._refill_at = 0
        #: The claim being zeroed ([lo, hi) in file ``_claim_mf``); hi 0: none.
        self._claim_mf: MappedFile | None = None
        self._claim_lo = 0
        self._claim_hi = 0
        #: Counters: zero writes by the loop, by the thread, the thread's syncs, loop waits.
        self.inline_writes = 0
        self.background_writes = 0
        self.syncs = 0
        self.waits = 0
        #: Chunks written back one at a time under flush rounds (``sync_file_range``).
        self.written_back = 0
        #: The appender's rate (bytes/s), measured over >= 50 ms between chunks.
        self._rate = 0.0
        self._rate_mark: tuple[float, MappedFile | None, int] = (time.monotonic(), None, 0)

    # ------------------------------------------------------------------ the loop's side
    def before_write(self, mf: MappedFile, start: int, end: int, small: bool) -> None:
        """Called by the loop before it writes ``[start, end)`` of ``mf``; ``small``: a write
        that wants zeros ahead of it (larger writes get large folios by themselves)."""
        if mf is self.mf and end <= self.zeroed_to:
            if end > self._refill_at:
                self._kick()
            return
        self._slow(mf, start, end, small)

    def _slow(self, mf: MappedFile, start: int, end: int, small: bool) -> None:
        cv = self._cv
        with cv:
            if mf is not self.mf:  # a new file: the thread starts past this write
                self._switch(mf, start)
                first = True
            else:
                first = False
            if end > self._reserved:
                self._reserved = end  # later claims start past it
            while self._claim_hi and self._claim_mf is mf and self._claim_lo < end:
                self.waits += 1  # the thread is zeroing where this write goes: let it finish
                cv.wait()
            inline = small and end > self.zeroed_to and (not self.background or not first)
            if inline:
                limit = mf.file_size
                if self._claim_hi and self._claim_mf is mf:
                    limit = min(limit, self._claim_lo)  # a claim past this write: up to it
                self.inline_writes += 1
                self.zeroed_to = max(
                    self.zeroed_to, self._write(mf.fd, max(self.zeroed_to, start), end, self.chunk, limit)
                )
            elif end > self.zeroed_to:
                self.zeroed_to = end  # written by the loop: never the thread's
            if self.background:
                self._refill_at = self.zeroed_to - self.window // 2
                self._wake()

    def _switch(self, mf: MappedFile, start: int) -> None:
        if self._fd >= 0:
            self._retired.append(self._fd)  # the thread may be using it: it closes it
            self._fd = -1
        self.mf = mf
        self.zeroed_to = self._reserved = start
        self._refill_at = start - 1
        if self.background:
            try:
                self._fd = os.dup(mf.fd)  # the thread's own: a close of the file cannot reuse it
            except OSError as exc:
                log.warning("no zeros ahead in %s: %s", mf.path, exc)
                self.mf = None

    def _kick(self) -> None:
        if not self._kicked and self.background:
            with self._cv:
                self._wake()

    def _wake(self) -> None:
        # Caller holds the lock.
        if self._kicked or self._stopping:
            return
        self._kicked = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="commitlog-zeros", daemon=True)
            self._thread.start()
        self._cv.notify_all()

    # ------------------------------------------------------------------ the thread
    def _next_claim(self) -> tuple[MappedFile, int, int, int] | None:
        # Caller holds the lock: the next chunk to zero, claimed, or None.
        mf = self.mf
        if mf is None or self._fd < 0 or self._claim_hi:
            return None
        lo = max(self.zeroed_to, self._reserved)
        target = min(mf.file_size, max(self._reserved, mf.wrote_position) + self.window)
        if lo >= target:
            return None
        hi = min(mf.file_size, (lo // self.chunk + 1) * self.chunk)
        self._claim_mf, self._claim_lo, self._claim_hi = mf, lo, hi
        return mf, self._fd, lo, hi

    def _run(self) -> None:
        name_this_thread()
        try:
            self._work()
        except BaseException:
            log.exception("the zeros-ahead thread failed; the appender writes them from now on")
        finally:
            with self._cv:
                if self._thread is threading.current_thread():
                    self.background = False  # not restarted: inline, as before the thread
                    self._thread = None
                self._claim_hi = 0
                self._claim_mf = None
                self._cv.notify_all()

    def _work(self) -> None:
        cv = self._cv
        dirty_fd = -1
        while True:
            with cv:
                claim = None
                while not self._stopping:
                    claim = self._next_claim()
                    if claim is not None:
                        break
                    if dirty_fd >= 0:
                        break  # filled: sync what was written before sleeping
                    self._kicked = False
                    self._close_retired()
                    cv.notify_all()  # wait_idle
                    cv.wait()
                if self._stopping:
                    return
            if claim is None:
                fd, dirty_fd = dirty_fd, -1
                try:
                    os.fdatasync(fd)  # the zeros on disk: a round only overwrites written blocks
                    self.syncs += 1
                    self._synced_at = time.monotonic()
                except OSError as exc:
                    log.debug("zeros ahead: fdatasync failed: %s", exc)
                continue
            mf, fd, lo, hi = claim
            try:
                done = self._write(fd, lo, lo, self.chunk, hi)
            except OSError:  # zero_ahead reports none; a wrapper might
                done = hi
            self.background_writes += 1
            with cv:
                if self.mf is mf:
                    self.zeroed_to = max(self.zeroed_to, done)
                    self._refill_at = self.zeroed_to - self.window // 2
                self._claim_hi = 0
                self._claim_mf = None
                if (
                    self.sync
                    and self._fd == fd
                    and time.monotonic() - self._synced_at >= self.sync_interval_s
                ):
                    dirty_fd = fd
                write_back = self.sync and self._fd == fd and done > lo and self._slow_appender()
                cv.notify_all()
            if write_back and can_write_back():
                # The chunk's writeback now, on this thread, before the next chunk is zeroed (the
                # fd stays open: a retired fd is closed by this thread only).
                sync_file_range(fd, lo, done - lo)
                self.written_back += 1

    def _slow_appender(self) -> bool:
        # Caller holds the lock.  Whether the log is appended slowly enough for the chunk's own
        # writeback to pay: at a low rate a round holds one or two sends and a chunk of zeros in
        # its writeback is its tail; at a high rate the rounds are large (they write MBs back
        # anyway) and a thread waiting for each chunk would fall behind the appender.
        now = time.monotonic()
        mf = self.mf
        # Where the appender is: it announces only writes past the zeros (rarely, while the
        # thread keeps ahead), so its file's write position.
        pos = max(self._reserved, mf.wrote_position if mf is not None else 0)
        t0, mf0, pos0 = self._rate_mark
        if mf0 is not mf or pos < pos0:
            self._rate_mark = (now, mf, pos)  # another file: measured from here (the rate kept)
        elif now - t0 >= 0.05:
            self._rate = (pos - pos0) / (now - t0)
            self._rate_mark = (now, mf, pos)
        return self._rate < WRITE_BACK_MAX_RATE

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until the thread has nothing to do (tests): ``True`` when it is idle."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._kicked and not self._claim_hi, timeout)

    def _close_retired(self) -> None:
        # Caller holds the lock and uses none of them.
        for fd in self._retired:
            os.close(fd)
        self._retired.clear()

    def stop(self) -> None:
        """Stop and join the thread (a claim in progress is finished first); close its fd."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=30)
        with self._cv:
            if self._fd >= 0:
                self._retired.append(self._fd)
                self._fd = -1
            self._close_retired()
            self.mf = None
            self._stopping = False
            self._kicked = False
