"""The transient store pool (RocketMQ's TransientStorePool): off-map write buffers, reused.

With ``transient_store_pool = true`` the commit log's writer packs records into one of these
buffers instead of the file; the flush policy's commit step copies them into the file with
``pwrite`` (GIL released, so on another core) and the buffer goes back to the pool once its file
is fully committed.  The buffers are allocated once, at store start, and their pages made
resident then (RocketMQ mlocks them), so appends write into memory that never faults: on a
fresh page the writer pays a fault and a zero-fill, about 15x the copy itself where we measured.

A file created while every buffer is in use (the commit step fell behind by ``pool_size`` files)
is written directly, as without the pool: slower, never refused.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import mmap
import os
import sys
import threading
import time

from tidemq.errors import StoreError

from .options import MmapStoreOptions

log = logging.getLogger(__name__)

#: Linux 5.14+: fault every page of a range in, writable, without changing its contents.
_MADV_POPULATE_WRITE = 23


def populate(buf: mmap.mmap) -> bool:
    """Make every page of ``buf`` resident; ``False`` when the kernel cannot (pages then fault lazily).

    Called through ctypes so the GIL is released: the pool fills in the background while writers
    run, and a buffer may be in use meanwhile (populating never changes its bytes).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        anchor = ctypes.c_char.from_buffer(buf)
        try:
            address = ctypes.addressof(anchor)
        finally:
            del anchor  # release the export, or the buffer could never be closed
        return madvise(address, len(buf), _MADV_POPULATE_WRITE) == 0
    except (OSError, AttributeError, ValueError):
        return False


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def transient_pool_for(options: MmapStoreOptions) -> TransientStorePool | None:
    """The pool ``[store.mmap]`` asks for; refused when it would pin over half of the memory."""
    if not options.transient_store_pool:
        return None
    need = options.transient_store_pool_size * options.commitlog_file_size
    memory = physical_memory()
    if memory and need > memory // 2:
        raise StoreError(
            f"the transient store pool needs transient_store_pool_size "
            f"{options.transient_store_pool_size} x commitlog_file_size {options.commitlog_file_size} "
            f"= {need >> 20} MiB of resident memory, over half of this machine's {memory >> 20} MiB: "
            f"lower one of them or set transient_store_pool = false"
        )
    return TransientStorePool(options.transient_store_pool_size, options.commitlog_file_size)


class TransientStorePool:
    """``pool_size`` anonymous buffers of ``file_size`` bytes each, lent to commit-log files."""

    def __init__(self, pool_size: int, file_size: int):
        if pool_size <= 0:
            raise ValueError(f"transient store pool size must be positive, got {pool_size}")
        self.pool_size = pool_size
        self.file_size = file_size
        self._free: collections.deque[mmap.mmap] = collections.deque()
        self._all: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._warned = False
        #: Files that found the pool empty and were written directly.
        self.deficits = 0

    def init(self) -> None:
        """Allocate the buffers and make them resident (at store start, as RocketMQ's init mlocks them).

        Costs about a second per GiB; the GIL is released meanwhile.
        """
        with self._lock:
            if self._all:
                return
            self._all = [mmap.mmap(-1, self.file_size) for _ in range(self.pool_size)]
            self._free.extend(self._all)
        t0 = time.monotonic()
        resident = all(populate(buf) for buf in self._all)
        log.info(
            "transient store pool: %d x %d MiB %s in %.2f s",
            self.pool_size,
            self.file_size >> 20,
            "resident" if resident else "allocated (pages fault in on first write)",
            time.monotonic() - t0,
        )

    @property
    def available(self) -> int:
        return len(self._free)

    def borrow(self) -> mmap.mmap | None:
        """A free buffer, or ``None`` when all are lent (the caller then writes directly)."""
        with self._lock:
            if self._free:
                self._warned = False
                return self._free.popleft()
            self.deficits += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "transient store pool: all %d buffers are waiting to be committed; "
                    "new commit-log files are written directly until one comes back",
                    self.pool_size,
                )
            return None

    def give_back(self, buf: mmap.mmap) -> None:
        """Return a buffer whose file is fully committed (its old bytes are never read again)."""
        with self._lock:
            if any(b is buf for b in self._all):
                self._free.append(buf)

    def destroy(self) -> None:
        with self._lock:
            buffers, self._all = self._all, []
            self._free.clear()
        for buf in buffers:
            try:
                buf.close()
            except BufferError:  # a view is still out: released with it
                pass
