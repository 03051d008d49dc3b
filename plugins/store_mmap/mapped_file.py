"""One fixed-size memory-mapped file named by its starting offset (RocketMQ's ``MappedFile``).

A :class:`MappedFile` tracks three positions, as RocketMQ's does:

* ``wrote_position``: bytes appended (by the single writer, under the store's lock);
* ``committed_position``: bytes moved from the off-map write buffer into the mapping (equal to
  ``wrote_position`` without a transient buffer);
* ``flushed_position``: bytes known to be on disk.

Durability uses ``os.fdatasync`` on the file descriptor rather than ``mmap.flush``: on Linux a
shared mapping's dirty pages are page-cache pages of the file, so fdatasync writes them, and it
releases the GIL so writers keep appending while a flush is in progress (group commit needs that).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from pathlib import Path

from tidemq.errors import StoreError
from tidemq.file_regions import register_mapping

from .transient_pool import TransientStorePool

PAGE_SIZE = mmap.PAGESIZE
OS_PAGE = 4096


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Deallocate a byte range (Linux fallocate PUNCH_HOLE): it reads as zeros and keeps the file sparse."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
        fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        return fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0
    except (OSError, AttributeError):
        return False


#: Blocks reserved ahead of the writes at a time (MappedFile.reserve).
RESERVE_CHUNK = 4 << 20
#: Zero-fill chunk: large enough that the per-call cost vanishes, small enough to keep memory flat.
_ZERO_CHUNK = bytes(1 << 20)


def allocate_blocks(fd: int, start: int, size: int, mode: str) -> None:
    """Grow the file behind ``fd`` from ``start`` to ``size`` bytes.

    * ``sparse``: only set the size; blocks are allocated as records are written (with ``pwrite``,
      which reports a full disk as ENOSPC).
    * ``fallocate``: reserve every block now (cheap: no data written), so a full disk fails the
      file's creation, before any write; the whole file takes its space from the start.  Where
      the filesystem cannot reserve, zeros are written instead (same guarantee, slower).
    """
    if mode == "sparse":
        os.ftruncate(fd, size)
        return
    try:
        os.posix_fallocate(fd, start, size - start)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    # Full size first: a crash mid-fill leaves a full-size file of zeros (and holes), which load
    # accepts, never a short file.
    os.ftruncate(fd, size)
    pos = start
    while pos < size:
        pos += os.pwrite(fd, _ZERO_CHUNK[: min(len(_ZERO_CHUNK), size - pos)], pos)
    os.fdatasync(fd)


def file_name(offset: int) -> str:
    """RocketMQ's 20-digit zero-padded file name for a starting offset."""
    return f"{offset:020d}"


class MappedFile:
    """One fixed-size file mapped into memory."""

    def __init__(
        self,
        path: Path,
        file_size: int,
        *,
        pool: TransientStorePool | None = None,
        reserve_blocks: bool = False,
        allocate: str = "sparse",
    ):
        self.path = Path(path)
        self.file_size = file_size
        try:
            self.file_from_offset = int(self.path.name)
        except ValueError as exc:
            raise StoreError(f"{self.path}: file name is not a 20-digit offset") from exc
        if reserve_blocks and allocate == "sparse":
            allocate = "fallocate"
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < file_size:
                allocate_blocks(fd, size, file_size, allocate)
            elif size > file_size:
                raise StoreError(f"{self.path}: size {size} does not match the configured {file_size}")
            self.mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as exc:
            os.close(fd)
            if created:
                # A half-made file (disk full) must neither hold space nor look like data at load.
                self.path.unlink(missing_ok=True)
            if isinstance(exc, OSError) and not exc.filename:
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc  # say which file
            raise
        self.fd = fd
        #: Bytes from the start whose blocks are known to be allocated: a write below this may go
        #: through the mapping (no SIGBUS possible there); -1 when the filesystem cannot fallocate.
        self.reserved = file_size if allocate == "fallocate" and size < file_size else 0
        # The off-map write buffer lent by the transient store pool (None: write the file directly).
        # It holds an older file's bytes past wrote_position: nothing there is read or committed.
        self._pool = pool
        self._buffer: mmap.mmap | None = pool.borrow() if pool is not None else None
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0  # store time of the last record appended
        self.flush_calls = 0
        self._closed = False
        # Registered as a sendfile source on the first pull from it (tidemq.file_regions).
        self._region_source = False

    # ------------------------------------------------------------------ positions
    @property
    def transient(self) -> bool:
        return self._buffer is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (its mapping and descriptor are gone)."""
        return self._closed

    @property
    def read_position(self) -> int:
        """Bytes a reader may see (everything appended: readers fall back to the write buffer)."""
        return self.wrote_position

    @property
    def free_space(self) -> int:
        return self.file_size - self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def set_positions(self, pos: int) -> None:
        """Used by recovery and truncation: everything up to ``pos`` is valid and on disk."""
        self.wrote_position = self.committed_position = self.flushed_position = pos

    # ------------------------------------------------------------------ writes
    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``pos`` (the caller holds the writer lock and advances positions).

        Small writes go through the mapping once their blocks are reserved (no syscall, the GIL
        kept: a ConsumeQueue entry costs a copy); anything else through :meth:`pwrite`.
        """
        if self._buffer is not None:
            self._buffer[pos : pos + len(data)] = data
        elif pos + len(data) <= self.reserved or self.reserve(pos + len(data)):
            self.mm[pos : pos + len(data)] = data
        else:
            self.pwrite(pos, data)

    def reserve(self, end: int) -> bool:
        """Make sure the blocks up to ``end`` are allocated; ``True`` when they are.

        Reserves :data:`RESERVE_CHUNK` ahead at a time with ``posix_fallocate``, so a sparse file
        takes its space as it fills (plus one chunk) and a write through the mapping below the
        reservation can never meet a full disk (SIGBUS).  A full disk raises ``OSError`` (ENOSPC);
        a filesystem that cannot fallocate answers ``False`` (writes then use ``pwrite``).
        """
        reserved = self.reserved
        if end <= reserved:
            return True
        if reserved < 0:
            return False
        new = min(self.file_size, max(end, reserved + RESERVE_CHUNK))
        try:
            os.posix_fallocate(self.fd, reserved, new - reserved)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self.reserved = -1
                return False
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
        self.reserved = new
        return True

    def pwrite(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``pos`` through the file descriptor, never through the mapping.

        Every write to a store file goes this way: on a full disk ``pwrite`` fails with ENOSPC (an
        ``OSError`` the store turns into a put status) where a store into a sparse mapping would
        kill the process with SIGBUS; and the kernel copies into the page cache without a page
        fault per 4 KiB page (2-3x faster than writing through the mapping on fresh pages).  The
        mapping shares the page cache, so readers see the bytes through it at once.

        A write the kernel answers with 0 bytes for a non-empty buffer is an ``OSError`` (EIO), as in
        the compiled writer (``_pwrite_all``): it made no progress, and trying again would spin.
        Linux does not do that for a local file (a full disk is ENOSPC, a size limit EFBIG), but
        POSIX allows it and a FUSE or network file system may.
        """
        fd = self.fd
        n = len(data)
        try:
            done = os.pwrite(fd, data, pos)
            while 0 < done < n:  # short writes are legal; a real error raises
                wrote = os.pwrite(fd, data[done:], pos + done)
                if wrote == 0:
                    break
                done += wrote
        except OSError as exc:
            if exc.filename:
                raise
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc  # say which file
        if done < n:
            raise OSError(
                errno.EIO,
                f"the write made no progress ({done} of {n} bytes written at {pos})",
                str(self.path),
            )

    def write_buffer(self) -> mmap.mmap:
        """Where appends go (the off-map buffer or the mapping), for a writer packing in place.

        The writer holds the store lock, writes at ``wrote_position`` and then calls :meth:`advance`.
        """
        return self._buffer if self._buffer is not None else self.mm

    def advance(self, n: int) -> None:
        """Publish ``n`` bytes written in place at ``wrote_position``."""
        pos = self.wrote_position + n
        self.wrote_position = pos
        if self._buffer is None:
            self.committed_position = pos

    def append(self, data: bytes | bytearray | memoryview) -> bool:
        """Append at ``wrote_position``; ``False`` when it does not fit."""
        n = len(data)
        pos = self.wrote_position
        if pos + n > self.file_size:
            return False
        self.write_at(pos, data)
        self.wrote_position = pos + n
        if self._buffer is None:
            self.committed_position = pos + n
        return True

    def commit(self, least_pages: int = 0) -> int:
        """Copy buffered bytes into the mapping; returns the committed position."""
        buf = self._buffer
        if buf is None:
            return self.committed_position
        wrote = self.wrote_position
        start = self.committed_position
        if wrote <= start:
            return start
        if least_pages > 0 and (wrote // OS_PAGE - start // OS_PAGE) < least_pages and wrote < self.file_size:
            return start
        with memoryview(buf) as src:  # one copy, buffer to file: pwrite, as RocketMQ's FileChannel.write
            self.pwrite(start, src[start:wrote])
        self.committed_position = wrote
        if wrote >= self.file_size:
            # Fully committed: readers now use the mapping, and the buffer serves the next file.
            self._release_buffer()
        return wrote

    def _release_buffer(self) -> None:
        buf, self._buffer = self._buffer, None
        if buf is not None and self._pool is not None:
            self._pool.give_back(buf)

    def flush(self, least_pages: int = 0) -> int:
        """fdatasync when at least ``least_pages`` pages are dirty (0: whenever any byte is)."""
        value = self.committed_position
        flushed = self.flushed_position
        if value <= flushed:
            return flushed
        if (
            least_pages > 0
            and (value // OS_PAGE - flushed // OS_PAGE) < least_pages
            and value < self.file_size
        ):
            return flushed
        if self._closed:
            return flushed
        os.fdatasync(self.fd)
        self.flush_calls += 1
        self.flushed_position = value
        return value

    # ------------------------------------------------------------------ reads
    def view(self, pos: int, size: int) -> memoryview | None:
        """A view of ``size`` bytes at ``pos``; ``None`` when beyond what was written."""
        if pos < 0 or size < 0 or pos + size > self.wrote_position:
            return None
        buf = self._buffer
        if buf is not None and pos + size > self.committed_position:
            # A copy: the buffer goes back to the pool once committed and is then reused, which
            # would change the bytes under a view a reader still holds.  Only the newest records
            # (up to one commit interval) are read from here.
            try:
                data = buf[pos : pos + size]
            except ValueError:  # closed by a concurrent shutdown
                return None
            if self.committed_position < pos + size:
                return memoryview(data)
            # Committed meanwhile: the buffer may already hold another file's bytes, the file has these.
        if self._closed:
            return None
        try:
            return memoryview(self.mm)[pos : pos + size]
        except ValueError:  # closed by a concurrent cleanup: the data is gone
            return None

    def scan_window(self) -> tuple[memoryview, int] | None:
        """The whole mapping and how many bytes from its start can be served from it as views (no
        copy), for the pull path's walk (:func:`tidemq.message.scan_queue`); None once closed.

        Under the transient pool only committed bytes qualify: :meth:`view` copies the newer ones.
        """
        readable = self.committed_position if self._buffer is not None else self.wrote_position
        if self._closed:
            return None
        if not self._region_source:
            # Pull responses are views of this mapping: let the transport sendfile them.  Tried
            # once; a mapping that cannot be registered is simply written as usual.
            self._region_source = True
            register_mapping(self.mm, self.fd)
        try:
            return memoryview(self.mm), readable
        except ValueError:  # closed by a concurrent cleanup
            return None

    def view_from(self, pos: int) -> memoryview | None:
        """Everything readable from ``pos`` to the read position."""
        return self.view(pos, self.read_position - pos) if pos <= self.read_position else None

    def raw_view(self) -> memoryview:
        """The whole mapping (recovery scans it; positions are not yet known)."""
        return memoryview(self.mm)

    # ------------------------------------------------------------------ lifecycle
    def warm_up(self) -> None:
        """Touch every page so the first writes do not fault (optional, like RocketMQ's warmMappedFile)."""
        zero = bytes(OS_PAGE)
        for pos in range(0, self.file_size, OS_PAGE):
            self.pwrite(pos, zero[: min(OS_PAGE, self.file_size - pos)])
        os.fdatasync(self.fd)

    def zero_tail(self, pos: int) -> None:
        """Make ``[pos, file_size)`` read as zeros: a hole punched when the filesystem can, else zeros written."""
        if pos >= self.file_size:
            return
        self.reserved = min(self.reserved, pos)  # a punched range has no blocks any more
        if not _punch_hole(self.fd, pos, self.file_size - pos):
            chunk = bytes(min(1 << 22, self.file_size - pos))
            for start in range(pos, self.file_size, len(chunk)):
                end = min(start + len(chunk), self.file_size)
                self.pwrite(start, chunk[: end - start])

    def last_modified(self) -> float:
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._release_buffer()  # the pool owns it (and frees it when the store shuts down)
        try:
            self.mm.close()
        except BufferError:
            # A reader still holds a view: the mapping is released when the last view goes.
            pass
        os.close(self.fd)

    def destroy(self) -> None:
        """Close and delete the file (readers holding views keep their pages until they drop them)."""
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote_position}, flushed={self.flushed_position})"
