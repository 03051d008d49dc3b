"""Flush policy contract (role ``flush``): when appended bytes reach the disk."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, runtime_checkable


@runtime_checkable
class Flushable(Protocol):
    """What a flush policy drives: usually the commit log's MappedFileQueue."""

    def flush(self, least_pages: int = 0) -> int:
        """Flush at least ``least_pages`` dirty pages (0: everything); returns the flushed offset."""

    def commit(self, least_pages: int = 0) -> int:
        """Move bytes from a transient write buffer into the mapped files (no-op without one)."""

    @property
    def flushed_where(self) -> int: ...


@runtime_checkable
class FlushPolicy(Protocol):
    """Decides when to flush and tells writers when their bytes are durable."""

    def start(self, target: Flushable) -> None: ...

    def request(self, end_offset: int) -> Future[bool]:
        """Ask for durability up to ``end_offset``; resolves ``True`` when flushed, ``False`` on timeout."""

    def shutdown(self) -> None:
        """Flush everything and stop."""
