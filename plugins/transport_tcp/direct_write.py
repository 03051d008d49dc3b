"""A connection's frames written straight to its socket, mapped store files with ``sendfile``.

Used only while the transport's own buffer is empty (so nothing can overtake bytes it still holds)
and never under TLS.  Whatever the socket does not take at once is handed back, in order, for the
transport to write and buffer as usual: flow control (pause_writing, the high-water mark) stays
the transport's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from tidemq.file_regions import MIN_SENDFILE_BYTES, file_region

#: iovecs per writev (Linux allows 1024).
_IOV_MAX = 512

Chunk = bytes | memoryview

#: Bytes this process sent with sendfile and with direct writev, and how often the socket did not
#: take everything (the rest went through the transport).  Tests and metrics read them.
counters = {"sendfile_bytes": 0, "writev_bytes": 0, "handed_back": 0}


def _size(chunk: Chunk) -> int:
    return len(chunk) if type(chunk) is bytes else memoryview(chunk).nbytes


def _rest(chunk: Chunk, done: int) -> memoryview:
    return memoryview(chunk)[done:]


def write_direct(fd: int, chunks: Sequence[Chunk], cork: Callable[[int], None] | None = None) -> list[Chunk]:
    """Write ``chunks`` in order to the non-blocking socket ``fd``; returns what is left unsent.

    Chunks that are views of a registered file mapping (:mod:`tidemq.file_regions`) and at least
    :data:`~tidemq.file_regions.MIN_SENDFILE_BYTES` long go with ``os.sendfile``: the kernel moves
    the page-cache pages to the socket without copying them in from user space.  Runs of other
    chunks go with one ``os.writev``.  A full socket buffer or an error stops the direct writes;
    the rest (the first chunk cut where the socket stopped) is returned for the transport, which
    then meets the same error itself and closes the connection as it always does.
    """
    regions = [
        file_region(c) if type(c) is memoryview and c.nbytes >= MIN_SENDFILE_BYTES else None for c in chunks
    ]
    # Corked, the headers (writev) and bodies (sendfile) of the frames leave as full segments, not
    # a small packet per call; uncorking at the end pushes out the last partial segment.
    if cork is not None:
        cork(1)
    try:
        return _write(fd, chunks, regions)
    finally:
        if cork is not None:
            cork(0)


def _write(fd: int, chunks: Sequence[Chunk], regions: list[tuple[int, int] | None]) -> list[Chunk]:
    n = len(chunks)
    i = 0
    while i < n:
        region = regions[i]
        if region is not None:
            chunk = chunks[i]
            size = memoryview(chunk).nbytes
            in_fd, offset = region
            sent = 0
            try:
                while sent < size:
                    done = os.sendfile(fd, in_fd, offset + sent, size - sent)
                    if done == 0:  # the file ends early: let the transport write the view
                        break
                    sent += done
            except OSError:  # BlockingIOError (socket full) and real errors alike
                pass
            counters["sendfile_bytes"] += sent
            if sent < size:
                counters["handed_back"] += 1
                return [_rest(chunk, sent), *chunks[i + 1 :]]
            i += 1
            continue
        j = i
        while j < n and j - i < _IOV_MAX and regions[j] is None:
            j += 1
        run = chunks[i:j]
        try:
            written = os.writev(fd, run)
        except OSError:
            written = 0
        counters["writev_bytes"] += written
        for k, chunk in enumerate(run):
            size = _size(chunk)
            if written < size:
                counters["handed_back"] += 1
                first = _rest(chunk, written) if written else chunk
                return [first, *run[k + 1 :], *chunks[j:]]
            written -= size
        i = j
    return []
