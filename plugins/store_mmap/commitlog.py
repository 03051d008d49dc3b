"""The commit log: every message of every topic appended to one sequence of mapped files.

Records use RocketMQ 4.x's layout (:mod:`tidemq.message`).  When a record does not fit in the
rest of a file, a BLANK record (TOTALSIZE = the remaining bytes, MAGICCODE = 0xCBD43194) fills
the file and the record goes to the next one, so a record never straddles two files.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from tidemq.errors import CorruptDataError, StoreError
from tidemq.extensions import compiled_twin
from tidemq.flush import DirectRound
from tidemq.logs import Progress
from tidemq.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MessageExt,
    PreparedBatch,
    RecordEncoder,
    decode_message,
)

from .allocate_service import AllocateService
from .mapped_file import MappedFile
from .mapped_file_queue import MappedFileQueue
from .transient_pool import TransientStorePool
from .zeros_ahead import ZerosAhead

log = logging.getLogger(__name__)

#: The compiled encoder's batch (None when the reference runs): packed and written by one call
#: (RecordEncoder.write_file); the store's put also takes its columns and fused calls.
COMPILED_BATCH: type | None = getattr(compiled_twin("tidemq._native._record_encode"), "PreparedRecords", None)

#: TOTALSIZE + MAGICCODE of the blank record; a file always keeps room for it.
END_FILE_MIN_BLANK_LENGTH = 8
_BLANK = struct.Struct(">iI")
_MAGIC_AT_4 = struct.Struct(">I")
_I32 = struct.Struct(">i")
#: A single record up to this size is packed in place through the mapping (see append_records).
IN_PLACE_MAX = 64 * 1024
_PAGE = 4096
_ZERO_PAGE = bytes(_PAGE)
#: Records between two progress updates of a scan (an update reads the clock).
_PROGRESS_RECORDS = 4096
#: Bytes of zeros a batch write keeps written ahead of itself (CommitLog._zero_ahead); 0: none.
ZERO_AHEAD = 256 * 1024
_ZEROS = bytes(ZERO_AHEAD)


def zero_ahead(fd: int, zeroed: int, end: int, chunk: int, limit: int) -> int:
    """Write zeros from ``zeroed`` past ``end`` to the next multiple of ``chunk`` (at most to
    ``limit``) with one ``pwrite``; returns where the zeros now end.

    The page cache takes a write of a few KiB into fresh pages one small folio at a time (an
    allocation, a memory-cgroup charge, an LRU insertion and the filesystem's block reservation
    each); one aligned write of ``chunk`` zeros gets large folios, and the records written into
    them later only copy.  Measured on ext4 (kernel 6.18) with a flush every 100 ms, the zeros
    included: 8.6 KB records 7.5 -> 3.4-3.8 us of CPU a write (and a record written through the
    mapping faults in a cached page instead of allocating one).  Nothing is read past the write
    position, and zeros read as the unwritten file does (recovery's end of the log).  Best
    effort: an error (a full disk) is the record's own write's to report.
    """
    if chunk <= 0:
        return zeroed
    new = min(limit, (end // chunk + 1) * chunk)
    if new <= zeroed:
        return zeroed
    zeros = _ZEROS if chunk <= len(_ZEROS) else bytes(chunk)
    try:
        with memoryview(zeros) as view:
            pos = zeroed
            while pos < new:
                pos += os.pwrite(fd, view[: min(len(view), new - pos)], pos)
    except OSError:
        return limit  # not again in this file: the records' own writes report the error
    return new


def written_extent(buf: memoryview | bytes | Any, start: int = 0, fd: int | None = None) -> int:
    """End of the written bytes of a log file from ``start`` on: where its zero suffix begins.

    A log file is written from its start and the rest stays zeros (preallocated or sparse), so a
    binary search over pages finds the end (about 20 pages of 1 GiB).  With the file's ``fd``,
    ``SEEK_HOLE`` first bounds the search to the extents holding data: the first read of an
    unwritten extent costs tens of milliseconds.  ``start`` when everything from it is zeros.
    An estimate when the written part itself holds a whole zero page (a body of zeros): good for
    progress totals and for counting cut bytes.
    """
    size = len(buf)
    if start >= size:
        return size
    first = start // _PAGE
    limit = size
    if fd is not None:
        try:
            hole = os.lseek(fd, start, os.SEEK_HOLE)
            try:
                os.lseek(fd, hole, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only holes after it: the data ends there
                    limit = min(size, hole)
        except OSError:  # a file system without SEEK_HOLE: search the whole file
            pass
        if limit <= start:
            return start

    def zero(page: int) -> bool:
        lo = max(start, page * _PAGE)
        hi = min(size, (page + 1) * _PAGE)
        return bytes(buf[lo:hi]) == _ZERO_PAGE[: hi - lo]

    lo, hi = first, (limit + _PAGE - 1) // _PAGE  # pages lo.. may be written; pages hi.. are zeros
    while lo < hi:
        mid = (lo + hi) // 2
        if zero(mid):
            hi = mid
        else:
            lo = mid + 1
    if hi == first:
        return start
    page_start = max(start, (hi - 1) * _PAGE)
    tail = bytes(buf[page_start : min(size, hi * _PAGE)])
    return page_start + len(tail.rstrip(b"\0"))


def _zero_ahead(fd: int, zeroed: int, end: int, chunk: int, limit: int) -> int:
    return zero_ahead(fd, zeroed, end, chunk, limit)  # the module's, looked up at each call


def _write_or_wipe(mf: MappedFile, start: int, buf: bytearray | memoryview, total: int) -> None:
    """``buf[:total]`` written at ``start``; on a failed write, zeros written there (best effort:
    no partial record left for recovery) and the error raised."""
    try:
        with memoryview(buf) as view:
            mf.pwrite(start, view[:total])
    except OSError:
        try:
            mf.pwrite(start, bytes(total))
        except OSError:
            pass
        raise


class CommitLogFullError(StoreError):
    """A record is larger than a whole commit-log file."""


class RecordEncodeError(StoreError):
    """A field is out of its Java range (flag, timestamps...): the batch cannot be packed."""


class BatchesEncodeError(RecordEncodeError):
    """:meth:`CommitLog.append_batches`: batch ``index`` cannot be packed (nothing was written)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class CommitLog:
    """Appends and reads records; it is the :class:`tidemq.flush.Flushable` the flush policy drives."""

    def __init__(
        self,
        directory: Path,
        file_size: int,
        allocator: AllocateService | None,
        *,
        pool: TransientStorePool | None = None,
        allocate: str = "fallocate",
    ):
        self.queue = MappedFileQueue(directory, file_size, allocator, pool=pool, allocate=allocate)
        self.file_size = file_size
        # Records of one append, packed before their pwrite: the reference encoder's batches only
        # (the compiled encoder packs in its own buffer), so it grows on their first use.
        self._wbuf = bytearray()
        #: Zeros written ahead of the writes (zero_ahead), by a background thread (ZerosAhead)
        #: in chunks of this many bytes; 0: none.
        self.zero_ahead = ZERO_AHEAD
        self.zeros = ZerosAhead(_zero_ahead, ZERO_AHEAD)
        #: The largest single record packed through the mapping (append_records); 0: none, every
        #: record is written with pwrite.
        self.in_place_max = IN_PLACE_MAX

    @property
    def _zeroed_mf(self) -> MappedFile | None:
        return self.zeros.mf

    @property
    def _zeroed_to(self) -> int:
        return self.zeros.zeroed_to

    def shutdown(self) -> None:
        """Stop the zeros-ahead thread (joined), then close the files."""
        self.zeros.stop()
        self.queue.shutdown()

    def use_flush_rounds(self) -> None:
        """Write for a flush policy that flushes every few puts (group commit, ``sync``).

        Each round's ``fdatasync`` writes back every dirty page of the file, a folio at a time.  A
        store through the mapping dirties the whole folio (``page_mkwrite`` marks every block of
        it), a ``pwrite`` only the blocks it wrote; and the folios where the records go are large
        (256 KiB from the zeros ahead, 64-128 KiB from readahead without them).  So under sync
        flush single records are written with ``pwrite``, not packed through the mapping: a round
        of 32 single 1 KiB puts wrote back 256-512 KiB for 32 KiB of records before
        (docs/flush.md, "What a sync round writes back").  The zeros ahead stay: turning them off
        under sync flush cost the broker's batched sends CPU (fresh small folios per write).
        """
        self.in_place_max = 0
        # The zeros ahead written by a thread and made durable off the rounds (docs/flush.md,
        # "Zeros ahead off the loop"); under async flush they stay inline: a thread's zero writes
        # beside the appender's on the same file cost the batched sends CPU there.
        self.zeros.background = self.zeros.sync = True

    # ------------------------------------------------------------------ Flushable
    def flush(self, least_pages: int = 0) -> int:
        """Flush what is committed (the policy commits first when a transient buffer is used)."""
        return self.queue.flush(least_pages)

    def commit(self, least_pages: int = 0) -> int:
        return self.queue.commit(least_pages)

    @property
    def flushed_where(self) -> int:
        return self.queue.flushed_where

    # ------------------------------------------------------------------ DirectRoundFlushable
    def direct_round(self, end: int) -> DirectRound | None:
        """The sync policy's compiled round (tidemq.flush.DirectRoundFlushable): ``fdatasync`` of
        the last file, when ``end`` is written there and everything before that file is flushed."""
        queue = self.queue
        files = queue.files
        if not files:
            return None
        mf = files[-1]
        start = mf.file_from_offset
        if mf.transient or mf.closed or queue.flushed_where < start:
            return None  # a transient buffer to commit, or the previous file still to flush
        ts = mf.store_timestamp  # read before the position, as MappedFileQueue.flush does
        value = start + mf.committed_position
        if value < end:
            return None
        return (mf.fd, value, ts, mf)

    def direct_flushed(self, done: DirectRound) -> int:
        """What :meth:`MappedFileQueue.flush` records after its ``fdatasync``, for a compiled round's."""
        _fd, value, ts, token = done
        mf = cast(MappedFile, token)
        queue = self.queue
        with queue.flush_lock:
            rel = value - mf.file_from_offset
            # A file closed or truncated since (a live truncation): nothing of it to record.
            if mf.closed or rel > mf.committed_position or queue.flushed_where < mf.file_from_offset:
                return queue.flushed_where
            if rel > mf.flushed_position:
                mf.flushed_position = rel
                mf.flush_calls += 1
            if value > queue.flushed_where:
                queue.flushed_where = value
                if ts:
                    queue.store_timestamp = ts
            return queue.flushed_where

    @property
    def store_timestamp(self) -> int:
        """Store time of the newest record known to be flushed (the checkpoint's physic timestamp)."""
        return self.queue.store_timestamp

    # ------------------------------------------------------------------ writes (caller holds the store lock)
    def file_for(self, size: int) -> MappedFile:
        """The file the next ``size`` bytes go to, writing the blank end marker when needed."""
        files = self.queue.files
        if files:  # the usual case, without a call: the last file has room
            last = files[-1]
            if last.wrote_position + size + END_FILE_MIN_BLANK_LENGTH <= last.file_size:
                return last
        if size + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise CommitLogFullError(
                f"a {size}-byte append does not fit a {self.file_size}-byte commit-log file"
            )
        mf = self.queue.get_last_mapped_file(0)
        if mf is None:
            raise StoreError("cannot create a commit-log file")
        free = mf.free_space
        if size + END_FILE_MIN_BLANK_LENGTH > free:
            blank = _BLANK.pack(free, BLANK_MAGIC_CODE)
            if not mf.transient:
                self.zeros.before_write(mf, mf.wrote_position, mf.file_size, False)
            if mf.transient:
                # The pool's buffer holds an older file's bytes past the marker: commit zeros.
                blank += bytes(free - len(blank))
            mf.write_at(mf.wrote_position, blank)
            mf.wrote_position = self.file_size
            if not mf.transient:
                mf.committed_position = self.file_size
            mf = self.queue.get_last_mapped_file(0)
            if mf is None:
                raise StoreError("cannot create a commit-log file")
            queue = self.queue
            if queue.pool is not None and not mf.transient and queue.committed_where < mf.file_from_offset:
                # The pool lent every buffer: this file is written straight into its mapping, so
                # the earlier files' buffered records go in first.  Else a kill keeps this file's
                # records and loses theirs: a hole of zeros before later records.
                queue.commit()
        return mf

    def append_records(
        self,
        mf: MappedFile,
        encoder: RecordEncoder,
        batch: PreparedBatch,
        queue_offset: int,
        ts: int,
        step: int,
    ) -> list[int]:
        """Pack ``batch`` at the end of ``mf`` and publish it; returns the records' offsets.

        RocketMQ's DefaultAppendMessageCallback.doAppend.  Raises :class:`RecordEncodeError` or
        ``OSError`` (ENOSPC, EIO) with nothing published and no partial record left behind.
        """
        start = mf.wrote_position
        base = mf.file_from_offset + start
        total = batch.total
        # One small record: packed in place through the mapping once its blocks are reserved
        # (no syscall, no GIL hand-off between concurrent writers).  Batches: see below.
        in_place = mf.transient or (
            len(batch.sizes) == 1 and total <= self.in_place_max and mf.reserve(start + total)
        )
        # Zeros ahead (zero_ahead): a batch's pwrite then only copies, and a single record packed
        # through the mapping takes a page already cached instead of a fault that allocates it.
        # Written by a background thread; before_write keeps it off the bytes written here.
        if not mf.transient:
            chunk = self.zero_ahead
            if chunk > 0:
                zeros = self.zeros
                if chunk != zeros.chunk:
                    zeros.chunk = chunk
                end = start + total
                if mf is zeros.mf and end <= zeros.zeroed_to:  # the usual case, without a call
                    if end > zeros._refill_at:
                        zeros._kick()
                else:  # larger writes get large folios by themselves: no inline zeros for them
                    zeros.before_write(mf, start, end, 0 < total <= chunk // 2)
        if in_place:
            # Pack straight into the mapping or the off-map write buffer (the policy commits it).
            try:
                offsets = encoder.write_into(mf.write_buffer(), start, batch, queue_offset, base, ts, step)
            except (struct.error, TypeError, OverflowError) as exc:
                # Wipe what was packed past the write position so it can never be committed.
                mf.write_at(start, bytes(total))
                raise RecordEncodeError(f"cannot encode the message: {exc}") from exc
        elif type(batch) is COMPILED_BATCH:
            # The same, packed and written by one compiled call (in the encoder's own buffer).
            try:
                offsets = cast(Any, encoder).write_file(batch, mf.fd, start, queue_offset, base, ts, step)
            except (struct.error, TypeError, OverflowError) as exc:
                raise RecordEncodeError(f"cannot encode the message: {exc}") from exc
            except OSError as exc:
                try:
                    mf.pwrite(start, bytes(total))  # best effort: no partial record left for recovery
                except OSError:
                    pass
                raise OSError(exc.errno, exc.strerror, str(mf.path)) from exc  # say which file
        else:
            # Pack into one reused buffer, then one pwrite into the file: the kernel copies into
            # the page cache without a page fault per 4 KiB page, which writing through the
            # mapping costs (2-3x slower on fresh pages); readers see the same pages through it.
            # On a full disk pwrite fails with ENOSPC where a sparse mapping would SIGBUS.
            buf = self._wbuf
            if len(buf) < total:
                buf = self._wbuf = bytearray(max(total, 2 * len(buf), 64 * 1024))
            try:
                offsets = encoder.write_into(buf, 0, batch, queue_offset, base, ts, step)
            except (struct.error, TypeError, OverflowError) as exc:
                raise RecordEncodeError(f"cannot encode the message: {exc}") from exc
            _write_or_wipe(mf, start, buf, total)
        mf.advance(total)
        return offsets

    def append_batches(
        self,
        mf: MappedFile,
        encoder: RecordEncoder,
        items: Sequence[tuple[PreparedBatch, int, int]],
        ts: int,
    ) -> list[list[int]]:
        """Pack the batches ``items`` (``(batch, queue_offset, step)`` each) back to back at the end
        of ``mf`` with one ``pwrite``, and publish them; each batch's record offsets.

        The records are byte for byte what :meth:`append_records` writes for each batch in turn
        (the store's put of several groups in one call, :mod:`.group_put`); the caller checked that
        they fit the file.  Raises :class:`BatchesEncodeError` (naming the batch, nothing written)
        or ``OSError`` (ENOSPC, EIO; nothing published, no partial record left behind).
        """
        start = mf.wrote_position
        base = mf.file_from_offset + start
        total = 0
        for item in items:
            total += item[0].total
        if mf.transient:
            # Packed in place into the off-map write buffer (the policy commits it), as
            # append_records does for a transient file.
            target: Any = mf.write_buffer()
            at = start
        else:
            chunk = self.zero_ahead
            if chunk > 0:  # the zeros ahead of the write, as append_records keeps them
                zeros = self.zeros
                if chunk != zeros.chunk:
                    zeros.chunk = chunk
                end = start + total
                if mf is zeros.mf and end <= zeros.zeroed_to:
                    if end > zeros._refill_at:
                        zeros._kick()
                else:
                    zeros.before_write(mf, start, end, 0 < total <= chunk // 2)
            target = self._wbuf
            if len(target) < total:
                target = self._wbuf = bytearray(max(total, 2 * len(target), 64 * 1024))
            at = 0
        out: list[list[int]] = []
        pos = at
        for i, (batch, queue_offset, step) in enumerate(items):
            try:
                out.append(encoder.write_into(target, pos, batch, queue_offset, base + pos - at, ts, step))
            except (struct.error, TypeError, OverflowError) as exc:
                if mf.transient:  # wipe what was packed past the write position
                    mf.write_at(start, bytes(pos - at + batch.total))
                raise BatchesEncodeError(i, f"cannot encode the message: {exc}") from exc
            pos += batch.total
        if not mf.transient:
            _write_or_wipe(mf, start, target, total)
        mf.advance(total)
        return out

    def append_data(self, start_offset: int, data: bytes | memoryview) -> bool:
        """Append raw bytes at ``start_offset``, the log's end (RocketMQ's CommitLog.appendData).

        For replication; ``False`` when no file can take them.  An ``OSError`` (a full disk)
        keeps what was written before it.
        """
        view = memoryview(data)
        pos = 0
        try:
            while pos < len(view):
                mf = self.queue.get_last_mapped_file(start_offset + pos)
                if mf is None:
                    return False
                n = min(len(view) - pos, mf.free_space)
                if not mf.transient:
                    self.zeros.before_write(mf, mf.wrote_position, mf.wrote_position + n, False)
                mf.append(view[pos : pos + n])
                pos += n
        except OSError as exc:
            log.error("cannot append replicated data at %d: %s", start_offset + pos, exc)
            raise
        return True

    def rollback(self, mf: MappedFile, pos: int) -> None:
        """Take back bytes appended to ``mf`` from ``pos`` (nothing has been acknowledged for them)."""
        end = mf.wrote_position
        if end <= pos:
            return
        mf.write_at(pos, bytes(end - pos))
        mf.wrote_position = pos
        mf.committed_position = min(mf.committed_position, pos)
        mf.flushed_position = min(mf.flushed_position, pos)
        where = mf.file_from_offset + pos
        self.queue.committed_where = min(self.queue.committed_where, where)
        self.queue.flushed_where = min(self.queue.flushed_where, where)

    # ------------------------------------------------------------------ reads
    def get_min_offset(self) -> int:
        first = self.queue.first
        if first is None:
            return 0
        return first.file_from_offset

    def get_max_offset(self) -> int:
        return self.queue.get_max_offset()

    def get_data(self, offset: int, size: int) -> memoryview | None:
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        return mf.view(offset - mf.file_from_offset, size)

    def get_message(self, offset: int, size: int = -1) -> bytes | None:
        """A copy of the record at ``offset``; ``size`` < 0 reads it from the record's head."""
        if size < 0:
            head = self.get_data(offset, 4)
            if head is None:
                return None
            (size,) = _I32.unpack_from(head, 0)
            if size <= 0:
                return None
        data = self.get_data(offset, size)
        return bytes(data) if data is not None else None

    def get_data_from(self, offset: int) -> memoryview | None:
        """Everything readable from ``offset`` to the end of its file (replication, reput)."""
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        return mf.view_from(offset - mf.file_from_offset)

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        view = self.get_data(offset, size)
        if view is None:
            return -1
        try:
            return decode_message(view, with_body=False).store_timestamp
        except CorruptDataError:
            return -1

    # ------------------------------------------------------------------ recovery
    #: Bytes the last recovery cut after the last whole record (0 after a clean shutdown).
    cut_bytes = 0

    def check_record(self, view: memoryview, pos: int, check_crc: bool) -> tuple[str, int, MessageExt | None]:
        """Classify the bytes at ``pos``.

        ``("msg", size, msg)``, ``("blank", size, None)``, ``("end", 0, None)``, or
        ``("damaged", size, msg)``: a whole record whose body fails its CRC, followed by another
        good record.  That is damage inside the log (a flipped bit), not a torn tail: the record
        is skipped (reads never serve it) and the good records after it are kept.
        """
        if pos + 8 > len(view):
            return "end", 0, None
        total, magic = _BLANK.unpack_from(view, pos)
        if magic == BLANK_MAGIC_CODE and total == len(view) - pos:
            return "blank", total, None
        if magic != MESSAGE_MAGIC_CODE or total <= 0:
            return "end", 0, None
        try:
            msg = decode_message(view, pos, check_crc=check_crc, with_body=False)
        except CorruptDataError as exc:
            damaged = self._damaged_inside(view, pos, total) if check_crc else None
            if damaged is not None:
                return "damaged", total, damaged
            log.warning("commit log %s: %s; the log ends here", self.queue.directory, exc)
            return "end", 0, None
        return "msg", total, msg

    def _damaged_inside(self, view: memoryview, pos: int, total: int) -> MessageExt | None:
        """The record at ``pos`` when only its body CRC is bad and a good record follows it."""
        try:
            msg = decode_message(view, pos, check_crc=False, with_body=False)
        except CorruptDataError:
            return None
        nxt = pos + total
        if msg.store_size != total or nxt + 8 > len(view):
            return None
        after, magic = _BLANK.unpack_from(view, nxt)
        if magic == BLANK_MAGIC_CODE and after == len(view) - nxt:
            return msg
        if magic != MESSAGE_MAGIC_CODE or after <= 0:
            return None
        try:
            decode_message(view, nxt, check_crc=True, with_body=False)
        except CorruptDataError:
            return None
        return msg

    def scan(
        self,
        start_file_index: int,
        check_crc: bool,
        on_message: Callable[[MessageExt], None] | None,
        progress: Progress | None = None,
    ) -> int:
        """Validate records from the file at ``start_file_index``; returns the end of the valid data.

        ``progress`` counts the bytes checked against the bytes written from that file on (its
        ``items``: records), updated every few thousand records.
        """
        files = self.queue.files
        if not files:
            return 0
        idx = first = max(0, min(start_file_index, len(files) - 1))
        process_offset = files[idx].file_from_offset
        if progress is not None:
            progress.add_total(self._written_from(idx))
        checked = 0  # bytes of the files done
        records = 0
        while idx < len(files):
            mf = files[idx]
            view = mf.raw_view()
            pos = 0
            try:
                while True:
                    kind, size, msg = self.check_record(view, pos, check_crc)
                    if (
                        kind == "damaged"
                        and msg is not None
                        and msg.commit_log_offset == mf.file_from_offset + pos
                    ):
                        log.error(
                            "commit log: the record at offset %d (%s-%d queue offset %d) fails its body "
                            "CRC; skipped, the records after it are kept",
                            msg.commit_log_offset,
                            msg.topic,
                            msg.queue_id,
                            msg.queue_offset,
                        )
                        pos += size
                        continue
                    if kind == "damaged":
                        kind = "end"
                    if kind == "msg":
                        if msg is not None and msg.commit_log_offset != mf.file_from_offset + pos:
                            log.warning(
                                "commit log: record at %d claims offset %d; the log ends here",
                                mf.file_from_offset + pos,
                                msg.commit_log_offset,
                            )
                            kind = "end"
                        else:
                            if on_message is not None and msg is not None:
                                on_message(msg)
                            pos += size
                            records += 1
                            if progress is not None and records % _PROGRESS_RECORDS == 0:
                                progress.items = records
                                progress.update(checked + pos)
                            continue
                    break
            finally:
                view.release()
            process_offset = mf.file_from_offset + pos
            if kind == "blank":
                process_offset = mf.file_from_offset + self.file_size
                checked += self.file_size
                idx += 1
                if progress is not None:
                    progress.items = records
                    progress.update(checked)
                continue
            checked += pos
            break
        if progress is not None:
            progress.items = records
            progress.update(checked)
            progress.files = min(idx + 1, len(files)) - first
        return process_offset

    def _written_from(self, idx: int) -> int:
        """Bytes written in the files from ``idx`` on: whole files, then the last one's written part."""
        files = self.queue.files[idx:]
        if not files:
            return 0
        view = files[-1].raw_view()
        try:
            last = written_extent(view, 0, files[-1].fd)
        finally:
            view.release()
        return (len(files) - 1) * self.file_size + last

    def recover_normally(
        self,
        check_crc: bool,
        on_message: Callable[[MessageExt], None] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Validate the last three files and cut everything after the last good record."""
        end = self.scan(max(0, len(self.queue.files) - 3), check_crc, on_message, progress)
        self._truncate(end)
        return end

    def recover_abnormally(
        self,
        min_timestamp: int,
        check_crc: bool,
        on_message: Callable[[MessageExt], None],
        progress: Progress | None = None,
    ) -> int:
        """Re-validate from the file holding the checkpoint, re-dispatching every record found."""
        files = self.queue.files
        start = 0
        for i in range(len(files) - 1, -1, -1):
            first_ts = self._first_store_timestamp(files[i])
            if first_ts is not None and first_ts <= min_timestamp:
                start = i
                break
        log.info("abnormal recovery of the commit log from file %s", files[start].path.name if files else "-")
        end = self.scan(start, check_crc, on_message, progress)
        self._truncate(end)
        return end

    def _first_store_timestamp(self, mf: MappedFile) -> int | None:
        view = mf.raw_view()
        try:
            (magic,) = _MAGIC_AT_4.unpack_from(view, 4)
            if magic != MESSAGE_MAGIC_CODE:
                return None
            msg = decode_message(view, 0, with_body=False)
            return msg.store_timestamp or None
        except CorruptDataError:
            return None
        finally:
            view.release()

    def _truncate(self, end: int) -> None:
        # After a clean shutdown the rest of the last file is the unwritten zeros: nothing is lost.
        # Bytes written past the last whole record (a torn write at a crash, records after a
        # damaged one) are lost data: say how many.
        cut = self.bytes_after(end)
        if cut:
            self.cut_bytes = cut
            log.warning(
                "commit log: %d bytes after offset %d are not whole records (a write torn by a crash); "
                "they are cut",
                cut,
                end,
            )
        elif self.queue.files and end < self.queue.get_max_offset():
            log.debug("commit log: valid data ends at offset %d; the rest is unwritten", end)
        self.queue.truncate_dirty_files(end)
        if not self.queue.files and end > 0:
            # Every file was cut; resume where the log ended so offsets never go back.
            self.queue.get_last_mapped_file(end)
            last = self.queue.last
            if last is not None:
                last.set_positions(end - last.file_from_offset)

    def bytes_after(self, end: int) -> int:
        """How far written bytes reach past ``end`` (0: only zeros follow), across the files."""
        reach = end
        for mf in self.queue.files:
            lo = max(end, mf.file_from_offset) - mf.file_from_offset
            if lo >= self.file_size:
                continue
            view = mf.raw_view()
            try:
                extent = written_extent(view, lo, mf.fd)
            finally:
                view.release()
            if extent > lo:
                reach = max(reach, mf.file_from_offset + extent)
        return reach - end

    def iter_records(self, start: int) -> Iterator[tuple[int, MessageExt]]:
        """Records from ``start`` to the end of the log (reput after recovery)."""
        offset = start
        end = self.get_max_offset()
        while offset < end:
            mf = self.queue.find_mapped_file_by_offset(offset)
            if mf is None:
                return
            view = mf.view_from(offset - mf.file_from_offset)
            if view is None:
                return
            kind, size, msg = self.check_record(view, 0, False)
            if kind == "msg" and msg is not None:
                yield offset, msg
                offset += size
            elif kind == "blank":
                offset = self.roll_next_file(offset)
            else:
                return
