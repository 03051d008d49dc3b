"""The mmap store's pull lane (issue 38): a pull's ConsumeQueue walk and record checks in one
compiled call, the records as views of the mapped commit log, no Python object per message.

Offered through :meth:`MmapMessageStore.pull_lane` (:class:`tidemq.store.PullLanes`) when the
compiled :mod:`tidemq._native._pull_lane` is built and not switched off (``TIDEMQ_NO_EXTENSIONS=1``,
or ``[store.mmap] request_lanes = false``).  :meth:`CompiledPullLane.pull` is
:func:`.reader.get_message` for the pulls it ends in one walk of one mapped file: the queue found,
the offset inside it, and a walk that took records and stopped at its limit, at ``max_count`` or at
``max_bytes`` (never at an entry the careful loop handles: filler, another file, damage, an
unreadable record).  Any other pull is None, and the broker calls ``get_message``; the figures
given are those ``get_message`` gives, computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.extensions import compiled_twin
from tidemq.store import PulledRecords, PullLane

from .commitlog import CommitLog
from .consume_queue import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from .reader import MAX_FILTER_BYTES
from .reput import ConsumeQueueTable

MODULE = "tidemq._native._pull_lane"
#: ``MmapMessageStore.get_message``'s default ``max_bytes`` (what the broker's pulls get).
MAX_BYTES = 256 * 1024
_CAREFUL = 2


class CompiledPullLane:
    """:class:`tidemq.store.PullLane` over the compiled module's ``walk``."""

    __slots__ = ("_check_crc", "_commitlog", "_cqs", "_memory", "_walk", "description")

    def __init__(
        self,
        walk: Callable[..., tuple[int, int, int, int, int, list[memoryview]]],
        cqs: ConsumeQueueTable,
        commitlog: CommitLog,
        check_crc: bool,
        memory_for_messages: Callable[[], int],
    ) -> None:
        self.description = f"PULL_MESSAGE (compiled: {MODULE})"
        #: The store's in-memory window now (the broker may change it at run time).
        self._memory = memory_for_messages
        self._walk = walk
        self._cqs = cqs
        self._commitlog = commitlog
        self._check_crc = check_crc

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tags: tuple[tuple[int, ...], tuple[bytes, ...]] | None,
    ) -> PulledRecords | None:
        cq = self._cqs.find(topic, queue_id)
        if cq is None:
            return None
        min_offset = cq.min_offset_in_queue
        max_offset = cq.max_offset_in_queue
        if offset < min_offset or offset >= max_offset:
            return None  # check_queue_offset's answers: the Python path gives them
        entries = cq.get_index_buffer(offset)
        if entries is None:
            return None
        try:
            limit = min(len(entries), max(MAX_FILTER_BYTES, max_count * CQ_STORE_UNIT_SIZE))
            limit -= limit % CQ_STORE_UNIT_SIZE
            if limit <= 0:
                return None
            commitlog = self._commitlog
            max_phy = commitlog.get_max_offset()
            mf = commitlog.queue.find_mapped_file_by_offset(CQ_ENTRY.unpack_from(entries, 0)[0])
            window = mf.scan_window() if mf is not None else None
            if window is None:
                return None
            i, count, total, last_phy, stop, runs = self._walk(
                entries,
                0,
                limit,
                window[0],
                mf.file_from_offset,  # type: ignore[union-attr]
                window[1],
                topic.encode(),
                queue_id,
                offset,
                max_count,
                MAX_BYTES,
                self._check_crc,
                tags,
            )
        finally:
            entries.release()
        if stop == _CAREFUL or not count:
            return None
        return PulledRecords(
            offset + i // CQ_STORE_UNIT_SIZE,
            min_offset,
            max_offset,
            count,
            total,
            max_phy - last_phy > self._memory(),
            tuple(runs),
        )


def compiled_pull_lane(
    cqs: ConsumeQueueTable, commitlog: CommitLog, check_crc: bool, memory_for_messages: Callable[[], int]
) -> PullLane | None:
    """The compiled pull lane over a store's queues and log, or None when it is not built or
    switched off."""
    module = compiled_twin(MODULE)
    if module is None:
        return None
    lane: PullLane = CompiledPullLane(module.walk, cqs, commitlog, check_crc, memory_for_messages)
    return lane


def describe() -> str:
    """One line for ``tidemq --version``: the pull lane the mmap store offers in this build."""
    if compiled_twin(MODULE) is None:
        from tidemq.extensions import twins

        reason = next((t.reason for t in twins() if t.module == MODULE), "not built")
        return f"no pull lane (the Python handler serves every pull: {reason})"
    return f"PULL_MESSAGE (compiled: {MODULE}), offered by the mmap store ([store.mmap] request_lanes)"
