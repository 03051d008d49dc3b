"""Flush policy contract (role ``flush``): when appended bytes reach the disk."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from tidemq.metrics import Buckets


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


@runtime_checkable
class RoundFlushPolicy(FlushPolicy, Protocol):
    """A flush policy that answers puts only after their round's flush (group commit, the
    built-in ``sync``), so each round flushes a few puts' bytes.

    Asked by the store at start (the mmap store writes single records with ``pwrite`` then, not
    through the mapping: a store through the mapping dirties a whole large folio, and each round
    would write it back; docs/flush.md, "What a sync round writes back")."""

    @property
    def flushes_in_rounds(self) -> bool:
        """True when puts are acknowledged after a flush round that covers them."""


@runtime_checkable
class FlushStatistics(Protocol):
    """A flush policy's counters (both built-ins keep them): read by metrics and runtime info.

    Implemented by the ``sync`` and ``async`` policies of the ``flush`` plugin; read, through
    :meth:`tidemq.store.StoreIntrospection.flush_statistics`, by the metrics exporter.  Plain
    counters written by the flush thread: a reader may see one round late, never a torn value.
    """

    @property
    def flush_rounds(self) -> int:
        """Flushes (fdatasync rounds) that wrote something."""

    @property
    def requests(self) -> int:
        """Puts that asked for durability (``rate(requests) / rate(flush_rounds)``: the batching)."""

    @property
    def flush_seconds(self) -> Buckets:
        """Seconds per flush round."""

    @property
    def batch_sizes(self) -> Buckets | None:
        """Puts made durable by one round (group commit), None when the policy does not batch."""


@attrs.frozen
class FlushRoundStats:
    """How a round-flushing policy's rounds ran, counted since its start (``sync``'s group commit).

    The rounds of :attr:`FlushStatistics.flush_rounds` not counted as ``inline`` or ``compiled``
    ran on the policy's Python flush thread.  Read by runtime info (``flushInlineRounds``...) and
    the metrics exporter (``tidemq_flush_inline_rounds_total``...); docs/metrics.md lists them.
    """

    #: Rounds flushed on an event loop at its kick (``[flush.sync] inline_max_us``).
    inline: int = 0
    #: Rounds a compiled worker flushed without the GIL (``[flush.sync] compiled_rounds``).
    compiled: int = 0
    #: Rounds that waited to gather the next group's sends (``[flush.sync] loop_gather_us``), and
    #: those of them whose wait ended by its time bound.
    gathered: int = 0
    gather_timeouts: int = 0
    #: Loop turns a kick was held for sends already arrived (``[flush.sync] kick_polls``), and kicks
    #: that found the worker idle but carried fewer than ``kick_min_messages`` messages (posted at once).
    kicks_held: int = 0
    kicks_sparse: int = 0
    #: Rounds the compiled worker held to gather the next cohort of a busy stream
    #: (``[flush.sync] worker_gather_us``), and those of them whose wait ended by its time bound.
    worker_gathered: int = 0
    worker_gather_timeouts: int = 0


@runtime_checkable
class RoundStatistics(Protocol):
    """A flush policy that tells how its rounds ran (the built-in ``sync``): besides
    :class:`FlushStatistics`, read through :meth:`tidemq.store.StoreIntrospection.flush_statistics`."""

    def round_stats(self) -> FlushRoundStats:
        """The counters now (a plain read of counters the flush threads write: one round late at most)."""


#: A round a compiled flush worker can run without the GIL (:class:`DirectRoundFlushable`):
#: ``(fd, end, store_timestamp, token)``: ``fdatasync(fd)`` makes everything before the absolute
#: offset ``end`` durable; ``store_timestamp`` is the data's store time (checkpoint); ``token`` is the
#: flushable's own (its file), handed back to :meth:`DirectRoundFlushable.direct_flushed`.
DirectRound = tuple[int, int, int, object]


@runtime_checkable
class DirectRoundFlushable(Flushable, Protocol):
    """A :class:`Flushable` whose flush round is one ``fdatasync`` on one file descriptor.

    The capability behind the ``sync`` policy's compiled rounds (``[flush.sync] compiled_rounds``,
    docs/flush.md, "A round without the GIL"): the policy asks, on the event loop, for the round
    that covers ``end`` (:meth:`direct_round`), hands ``fd`` and the round's end to a worker
    thread that never takes the GIL, and once that ``fdatasync`` returned (0) tells the flushable
    (:meth:`direct_flushed`), again on the loop, which then moves :attr:`flushed_where` as its
    own :meth:`flush` would have.  Implemented by the mmap store's commit log; a flushable
    without it (or a round it declines) is flushed by the policy's Python thread as before.
    """

    def direct_round(self, end: int) -> DirectRound | None:
        """The round covering ``end``, or None when it is not one ``fdatasync`` of bytes already
        written (a transient write buffer to commit first, a round that would cross into the next
        file, a closed file): the caller then flushes through :meth:`commit` and :meth:`flush`."""

    def direct_flushed(self, done: DirectRound) -> int:
        """``done``'s ``fdatasync`` succeeded: advance the flushed offsets; returns :attr:`flushed_where`."""
