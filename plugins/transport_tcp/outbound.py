"""A connection's frames on their way out (:class:`Outbound`): one writev per loop turn.

With many requests in flight, a ``send()`` per response was the broker's largest single cost:
frames written during one turn of the event loop are gathered and leave together at its end.
A request lane's answers (one ``bytes`` of whole frames per read) leave at once when nothing else
waits for the turn's end: the turn's flush would write that one chunk alone, a callback later.
Pull bodies that are views of mapped store files may go with ``sendfile``
(:mod:`tidemq_transport_tcp.direct_write`) while the transport buffers nothing.  Flow control stays
the transport's (its high-water mark; a big backlog is handed over at once so it can push back).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from tidemq.file_regions import MIN_SENDFILE_BYTES
from tidemq_transport_tcp.direct_write import write_direct
from tidemq_transport_tcp.options import TcpOptions

Chunk = bytes | memoryview


class Outbound:
    """The write side of one connection (see the module docstring)."""

    __slots__ = (
        "_bytes",
        "_chunks",
        "_coalesce",
        "_cork",
        "_direct_fd",
        "_file",
        "_high",
        "_loop",
        "_transport",
        "last_write",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, options: TcpOptions) -> None:
        self._loop = loop
        self._coalesce = options.coalesce_writes
        self._high = options.write_high_water
        self._transport: asyncio.Transport | None = None
        self._chunks: list[Chunk] | None = None  # frames waiting for the end of this loop turn
        self._bytes = 0
        self._file = False  # a pending chunk may be a mapped file's bytes (sendfile candidate)
        self._direct_fd = -1  # the socket, when frames may be written to it directly (no TLS)
        self._cork: Callable[[int], None] | None = None
        #: When frames last left (loop time): the connection's idle check counts writes as activity.
        self.last_write = loop.time()

    def attach(self, transport: asyncio.Transport, sendfile: bool) -> None:
        """Write to ``transport``; ``sendfile``: mapped file chunks may go straight to its socket."""
        self._transport = transport
        tls = transport.get_extra_info("sslcontext") or transport.get_extra_info("ssl_object")
        if sendfile and tls is None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                self._direct_fd = sock.fileno()
                self._cork = _corker(sock)

    def write(self, chunks: list[Chunk]) -> None:
        """One encoded command's chunks (the caller checked the transport is open)."""
        transport = self._transport
        assert transport is not None
        if not self._coalesce:
            if len(chunks) == 1:
                transport.write(chunks[0])
            else:
                transport.writelines(chunks)
            self.last_write = self._loop.time()
            return
        pending = self._chunks
        if pending is None:
            self._chunks = chunks
            self._loop.call_soon(self.flush)
        else:
            pending += chunks
        for c in chunks:
            if type(c) is bytes:
                self._bytes += len(c)
            else:
                size = c.nbytes if type(c) is memoryview else len(c)
                self._bytes += size
                if size >= MIN_SENDFILE_BYTES:
                    self._file = True
        if self._bytes >= self._high:
            self.flush()  # a big backlog goes now, so the transport can push back at once
        # The activity is noted when the frames leave (flush): once per loop turn.

    def write_frames(self, frames: bytes) -> None:
        """Whole encoded frames (a request lane's answers to one read), in order after what waits."""
        transport = self._transport
        assert transport is not None
        pending = self._chunks
        if pending is None or not self._coalesce:
            # Nothing waits for this turn's end: the turn's flush would write this chunk alone.
            transport.write(frames)
            self.last_write = self._loop.time()
            return
        pending.append(frames)
        self._bytes += len(frames)
        if self._bytes >= self._high:
            self.flush()

    def flush(self) -> None:
        """Hand what waits to the transport (or straight to the socket: mapped file chunks)."""
        chunks, self._chunks = self._chunks, None
        self._bytes = 0
        transport = self._transport
        if not chunks or transport is None or transport.is_closing():
            return
        self.last_write = self._loop.time()
        if self._file:
            self._file = False
            # Pull bodies from mapped store files: sendfile them while the transport holds nothing
            # (so nothing is overtaken); what the socket does not take goes through the transport.
            if self._direct_fd >= 0 and transport.get_write_buffer_size() == 0:
                chunks = write_direct(self._direct_fd, chunks, self._cork)
                if not chunks:
                    return
        if len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)


def _corker(sock: Any) -> Callable[[int], None] | None:
    """``TCP_CORK`` on/off for ``sock`` (Linux), or None where it has none."""
    option = getattr(socket, "TCP_CORK", None)
    if option is None:
        return None

    def cork(on: int) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, on)
        except OSError:
            pass

    return cork
