"""Cutting the commit log back at run time (a deposed master following a new one, issue 25).

What crash recovery does at load (:mod:`.recovery`), done on a live store: find the last record
boundary at or below the offset asked for, cut the consume queues and the key index first (so no
reader finds an entry for a record about to go), then the commit log itself, and bring the
in-memory positions (dispatch, flush and commit positions, files made ahead) back with it.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from tidemq.index import RecoverableIndex
from tidemq.message import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE

from .commitlog import CommitLog

if TYPE_CHECKING:
    from .store import MmapMessageStore

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE


def record_boundary(commitlog: CommitLog, offset: int) -> tuple[int, int]:
    """The end of the last whole record at or below ``offset`` (records never cross files), and
    that record's start (-1: none in its file).

    Walks the record heads from the start of the file holding ``offset``; a file always starts
    with a record.  Below the first file's start the answer is that start (the older data is gone).
    """
    end = commitlog.get_max_offset()
    if offset >= end:
        return end, -1
    start = commitlog.get_min_offset()
    if offset <= start:
        return start, -1
    mf = commitlog.queue.find_mapped_file_by_offset(offset)
    if mf is None:  # between files (none expected): cut at the next file's start below
        return start, -1
    target = offset - mf.file_from_offset
    view = mf.raw_view()
    try:
        pos, last = 0, -1
        limit = min(len(view), mf.wrote_position)
        while pos + 8 <= limit:
            total, magic = _HEAD.unpack_from(view, pos)
            if magic != MESSAGE_MAGIC_CODE or total <= 0 or pos + total > target:
                # A BLANK filler (the rest of the file) or the record the offset falls inside.
                if magic not in (MESSAGE_MAGIC_CODE, BLANK_MAGIC_CODE):
                    log.warning(
                        "commit log: no record head at %d while truncating", mf.file_from_offset + pos
                    )
                break
            last, pos = pos, pos + total
    finally:
        view.release()
    return mf.file_from_offset + pos, (mf.file_from_offset + last if last >= 0 else -1)


def truncate_commit_log(store: MmapMessageStore, offset: int) -> int:
    """:meth:`tidemq.store.TruncatableStore.truncate_commit_log` for the mmap store (its lock held)."""
    if offset < 0:
        raise ValueError(f"cannot truncate the commit log to a negative offset ({offset})")
    commitlog = store.commitlog
    with store._lock:
        old_end = commitlog.get_max_offset()
        # Bytes still in a transient pool's buffer go to the file first: set_positions() below
        # declares everything under the cut committed.
        commitlog.commit(0)
        end, last_start = record_boundary(commitlog, offset)
        if end >= old_end:
            return old_end
        # Queues and index first: a reader that finds an entry then finds its record.
        cut_queues = [cq for cq in store.cqs.all_queues() if cq.max_physic_offset > end]
        for cq in cut_queues:
            cq.truncate_dirty(end, trust_order=True)
            cq.min_logic_offset = min(cq.min_logic_offset, cq.queue.get_max_offset())
        index = store.index
        if isinstance(index, RecoverableIndex):
            index.truncate(end)
        elif index is not None:
            log.warning("the key index %s cannot be truncated: keys past %d may find nothing", index, end)
        if store.allocator is not None:
            # A file made ahead for the old tail would sit past a gap once the log is shorter.
            store.allocator.shutdown()
        commitlog.queue.truncate_dirty_files(end)
        if not commitlog.queue.files and end > 0:
            # The cut took every file: the log resumes at ``end``, never at 0.
            commitlog.queue.get_last_mapped_file(end)
            last = commitlog.queue.last
            if last is not None:
                last.set_positions(end - last.file_from_offset)
        store.reput.reput_from = end
        # The newest kept record's time: what the checkpoint may claim flushed from now on.
        ts = max(0, commitlog.pickup_store_timestamp(last_start, end - last_start)) if last_start >= 0 else 0
        commitlog.queue.store_timestamp = min(commitlog.queue.store_timestamp, ts)
        last = commitlog.queue.last
        if last is not None:
            last.store_timestamp = ts
        if store.checkpoint is not None:
            store.checkpoint.physic_msg_timestamp = min(store.checkpoint.physic_msg_timestamp, ts)
            store.checkpoint.logics_msg_timestamp = min(store.checkpoint.logics_msg_timestamp, ts)
            store.cqs.last_entry_ts = min(store.cqs.last_entry_ts, ts)
        commitlog.flush(0)
        # The store's service thread writes the checkpoint (with the times lowered above).
        for cq in cut_queues:
            cq.flush(0)
    log.warning(
        "commit log truncated from %d to %d (asked %d): %d bytes cut, %d consume queues shortened",
        old_end,
        end,
        offset,
        old_end - end,
        len(cut_queues),
    )
    return end
