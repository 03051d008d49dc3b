"""Where a memoryview's bytes lie in a file, so a transport can send them with ``sendfile``.

A store registers the shared mappings of its files (:func:`register_mapping`); a pull response's
body is views into those mappings.  A transport that can use ``os.sendfile`` asks
:func:`file_region` for each large chunk and, given ``(fd, offset)``, lets the kernel move the
page-cache pages to the socket instead of copying the bytes in from user space (RocketMQ's
``transferTo`` of a ``FileRegion``).  The bytes are the same either way: a shared mapping *is* the
file's page cache.

Safety: the registry keeps its own duplicate of the file descriptor, closed only when the mapping
object is garbage-collected.  A chunk (a memoryview) keeps its mapping alive, so while a transport
holds the chunk the descriptor reads the very inode the view maps, even if the store closed its
own descriptor or deleted the file in the meantime.  Anything not registered (bytes, an anonymous
write buffer, a read-only view) answers ``None`` and is written as usual.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import weakref

log = logging.getLogger(__name__)

__all__ = ["MIN_SENDFILE_BYTES", "file_region", "register_mapping"]

#: Chunks smaller than this are written as usual: below ~16 KiB one ``sendfile`` cost more CPU than
#: one ``send`` of the same bytes (a loopback probe on 2026-11-24; at 32 KiB it cost 30 % less).
MIN_SENDFILE_BYTES = 16 * 1024

# mapping -> (duplicated fd, address of its first byte)
_mappings: weakref.WeakKeyDictionary[mmap.mmap, tuple[int, int]] = weakref.WeakKeyDictionary()


def _address(buffer: memoryview | mmap.mmap) -> int:
    """Address of a writable buffer's first byte (the temporary export is released at once)."""
    holder = ctypes.c_char.from_buffer(buffer)
    try:
        return ctypes.addressof(holder)
    finally:
        del holder


def register_mapping(mm: mmap.mmap, fd: int) -> bool:
    """Make ``mm`` (a shared, writable mapping of the file open as ``fd``) a sendfile source.

    Idempotent.  ``False`` when it cannot be (a closed mapping, no descriptor left).
    """
    if mm in _mappings:
        return True
    try:
        address = _address(mm)
        dup = os.dup(fd)
    except (OSError, ValueError, TypeError, BufferError) as exc:
        log.debug("mapping not registered for sendfile: %s", exc)
        return False
    _mappings[mm] = (dup, address)
    weakref.finalize(mm, os.close, dup)
    return True


def file_region(view: memoryview) -> tuple[int, int] | None:
    """``(fd, offset)`` of the file bytes ``view`` shows, or ``None`` when it is no registered
    mapping's (or not a contiguous byte view of one)."""
    obj = view.obj
    if type(obj) is not mmap.mmap:
        return None
    entry = _mappings.get(obj)
    if entry is None or not view.c_contiguous or view.itemsize != 1:
        return None
    try:
        offset = _address(view) - entry[1]
        size = len(obj)
    except (TypeError, ValueError, BufferError):  # read-only view, released buffer
        return None
    if offset < 0 or offset + view.nbytes > size:
        return None
    return entry[0], offset
