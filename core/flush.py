"""Flush policy contract (role ``flush``): when appended bytes reach the disk."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable


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


@runtime_checkable
class SubmittingFlushPolicy(FlushPolicy, Protocol):
    """A flush policy with the store's fast path (both built-ins have it): no second future per put."""

    def submit(self, end_offset: int, future: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        """Resolve ``future`` with ``value`` once ``end_offset`` is durable, with ``on_timeout()`` if it never is."""
