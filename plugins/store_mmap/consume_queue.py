"""ConsumeQueue: per (topic, queue id) index of 20-byte entries into the commit log.

Entry layout (big-endian): commit-log offset 8 | record size 4 | tags hash code 8.  Entry ``n``
lives at byte ``n * 20`` of the logical queue; files hold a fixed number of entries.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any

from tidemq.message import pack_cq_entries
from tidemq.names import topic_dir

from .commitlog import zero_ahead
from .mapped_file import MappedFile
from .mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
CQ_ENTRY = struct.Struct(">qiq")
#: Zeros kept written ahead of the entries (:func:`.commitlog.zero_ahead`): the entries are then
#: copied through the mapping into pages already cached, instead of a page fault that allocates
#: one every ~200 entries (640 B of entries a put of 32: 0.63 -> 0.2 us a put measured alone).
ZERO_AHEAD = 64 * 1024
#: What RocketMQ writes into slots before the first real entry of a queue that starts mid-file.
_BLANK_ENTRY = CQ_ENTRY.pack(0, 0x7FFFFFFF, 0)


class ConsumeQueue:
    """One queue's entries; written by the store under its lock, read lock-free."""

    def __init__(
        self, topic: str, queue_id: int, root: Path, entries_per_file: int, allocate: str = "sparse"
    ):
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = entries_per_file * CQ_STORE_UNIT_SIZE
        # Entries are written with pwrite (MappedFile.append): a full disk is an OSError, not SIGBUS.
        # topic_dir refuses a name that is no topic or would leave ``root`` (InvalidNameError).
        self.queue = MappedFileQueue(
            topic_dir(root, topic) / str(queue_id), self.mapped_file_size, allocate=allocate
        )
        self.min_logic_offset = 0  # bytes
        self.max_physic_offset = -1  # end (offset + size) of the last record indexed
        self._zeroed_mf: MappedFile | None = None  # zeros written ahead: in which file, how far
        self._zeroed_to = 0

    # ------------------------------------------------------------------ load / recovery
    def load(self) -> None:
        self.queue.load()

    def recover(self) -> tuple[int, int]:
        """Keep the valid entries of the last three files; cut at the first empty or torn one.

        Returns the files and bytes of entries checked (for recovery's progress and summary).
        """
        files = self.queue.files
        if not files:
            return 0, 0
        idx = first = max(0, len(files) - 3)
        process_offset = files[idx].file_from_offset
        max_phy = -1
        while idx < len(files):
            mf = files[idx]
            view = mf.raw_view()
            pos = 0
            try:
                while pos + CQ_STORE_UNIT_SIZE <= self.mapped_file_size:
                    offset, size, _tags = CQ_ENTRY.unpack_from(view, pos)
                    if offset < 0 or size <= 0:
                        break
                    if size != 0x7FFFFFFF:
                        max_phy = offset + size
                    pos += CQ_STORE_UNIT_SIZE
            finally:
                view.release()
            process_offset = mf.file_from_offset + pos
            if pos == self.mapped_file_size and idx + 1 < len(files):
                idx += 1
                continue
            break
        self.max_physic_offset = max_phy
        self.queue.truncate_dirty_files(process_offset)
        return min(idx + 1, len(files)) - first, process_offset - files[first].file_from_offset

    def truncate_dirty(self, phy_end: int, *, trust_order: bool = False) -> None:
        """Drop entries that point at or past ``phy_end`` (the recovered end of the commit log).

        ``trust_order`` (a live truncation: the entries were written in log order and checked at
        load) skips, unread, each file whose last entry ends in time.
        """
        files = self.queue.files
        cut_at: int | None = None
        max_phy = -1
        for mf in files:
            view = mf.raw_view()
            try:
                start = 0
                if trust_order and mf.wrote_position >= CQ_STORE_UNIT_SIZE:
                    # A cut near the end must not walk every older entry of a long queue: skip
                    # the files that end in time, binary-search the first entry past the cut.
                    offset, size, _ = CQ_ENTRY.unpack_from(view, mf.wrote_position - CQ_STORE_UNIT_SIZE)
                    if size != 0x7FFFFFFF and offset + size <= phy_end:
                        max_phy = offset + size
                        continue
                    start = _first_past(view, mf.wrote_position // CQ_STORE_UNIT_SIZE, phy_end)
                    start = max(0, start - 1) * CQ_STORE_UNIT_SIZE  # the entry before: max_phy
                for pos in range(start, mf.wrote_position, CQ_STORE_UNIT_SIZE):
                    offset, size, _ = CQ_ENTRY.unpack_from(view, pos)
                    if size == 0x7FFFFFFF:
                        continue
                    if offset + size > phy_end:
                        cut_at = mf.file_from_offset + pos
                        break
                    max_phy = offset + size
            finally:
                view.release()
            if cut_at is not None:
                break
        if cut_at is not None:
            log.info(
                "consume queue %s-%d: cutting entries past commit-log offset %d",
                self.topic,
                self.queue_id,
                phy_end,
            )
            self.queue.truncate_dirty_files(cut_at)
        self.max_physic_offset = max_phy

    # ------------------------------------------------------------------ writes (store lock held)
    def put(self, offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """Write entry ``cq_offset``; an entry already present is left alone (re-dispatch is idempotent)."""
        if offset + size <= self.max_physic_offset:
            return True
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        mf = self._file_for(expect)
        current = mf.file_from_offset + mf.wrote_position
        if expect < current:
            return True
        while current < expect:
            mf.append(_BLANK_ENTRY)
            mf = self._file_for(expect)
            current = mf.file_from_offset + mf.wrote_position
        mf.append(CQ_ENTRY.pack(offset, size, tags_code))
        self.max_physic_offset = offset + size
        return True

    def put_packed(self, data: bytes, first_cq_offset: int, first_end: int = -1, last_end: int = -1) -> None:
        """Write consecutive entries already packed with :data:`CQ_ENTRY` (the batch write path).

        ``first_end`` and ``last_end``: where the first and the last entry's records end in the
        commit log, when the caller knows them (else they are read from ``data``).
        """
        expect = first_cq_offset * CQ_STORE_UNIT_SIZE
        files = self.queue.files
        last = files[-1] if files else None
        if first_end < 0:
            first_phy, first_size, _ = CQ_ENTRY.unpack_from(data, 0)
            first_end = first_phy + first_size
        if (
            last is not None
            and last.file_from_offset + last.wrote_position == expect
            and first_end > self.max_physic_offset
        ):
            end = last.wrote_position + len(data)
            if (last is not self._zeroed_mf or end > self._zeroed_to) and not last.transient:
                zeroed = self._zeroed_to if last is self._zeroed_mf else 0
                self._zeroed_to = zero_ahead(
                    last.fd, max(zeroed, last.wrote_position), end, ZERO_AHEAD, last.file_size
                )
                self._zeroed_mf = last
            if not last.append(data):
                self.put_many(list(CQ_ENTRY.iter_unpack(data)), first_cq_offset)
                return
            if last_end < 0:
                phy, size, _ = CQ_ENTRY.unpack_from(data, len(data) - CQ_STORE_UNIT_SIZE)
                last_end = phy + size
            self.max_physic_offset = last_end
            return
        self.put_many(list(CQ_ENTRY.iter_unpack(data)), first_cq_offset)

    def put_prepared(
        self, batch: Any, tags: list[int], first_cq_offset: int, first_end: int, last_end: int
    ) -> None:
        """The entries of a compiled batch just placed in the commit log (``PreparedRecords``):
        packed by one compiled call straight into the mapping, where zeros already wait for them
        (:func:`.commitlog.zero_ahead`); else as :meth:`put_packed` of ``batch.cq_entries(tags)``.
        The same bytes either way.  ``_group_put._put_prepared_fast`` (the store's compiled call of
        a read's groups) makes the same checks on the same fields: change both together.
        """
        last = self._zeroed_mf
        if last is not None:
            files = self.queue.files
            pos = last.wrote_position
            end = pos + 20 * len(batch)
            if (
                files
                and files[-1] is last
                and last.file_from_offset + pos == first_cq_offset * CQ_STORE_UNIT_SIZE
                and first_end > self.max_physic_offset
                and end <= self._zeroed_to
                and end <= last.reserved
                and batch.cq_entries_into(last.mm, pos, tags) > 0
            ):
                last.wrote_position = last.committed_position = end
                self.max_physic_offset = last_end
                return
        self.put_packed(batch.cq_entries(tags), first_cq_offset, first_end, last_end)

    def put_records(
        self,
        offsets: list[int],
        sizes: list[int],
        tags: list[int],
        first_cq_offset: int,
        base: int,
        total: int,
        prepared: Any = None,
    ) -> None:
        """The entries of one put's records (at ``offsets``, ``total`` bytes from ``base``): one
        :meth:`put` for a single record, :meth:`put_prepared` of a compiled batch, else
        :meth:`put_packed`."""
        if len(offsets) == 1:
            self.put(base, total, tags[0], first_cq_offset)
        elif prepared is not None:
            self.put_prepared(prepared, tags, first_cq_offset, base + sizes[0], base + total)
        else:
            self.put_packed(pack_cq_entries(offsets, sizes, tags), first_cq_offset)

    def put_many(self, entries: list[tuple[int, int, int]], first_cq_offset: int) -> None:
        """Write consecutive entries with one copy when they fit the current file (batches)."""
        expect = first_cq_offset * CQ_STORE_UNIT_SIZE
        last = self.queue.last
        data = b"".join([CQ_ENTRY.pack(*e) for e in entries])
        if (
            last is not None
            and last.file_from_offset + last.wrote_position == expect
            and entries[0][0] + entries[0][1] > self.max_physic_offset
            and last.append(data)
        ):
            self.max_physic_offset = entries[-1][0] + entries[-1][1]
            return
        for i, (offset, size, tags_code) in enumerate(entries):
            self.put(offset, size, tags_code, first_cq_offset + i)

    def _file_for(self, expect: int) -> MappedFile:
        if not self.queue.files:
            # A queue that starts late (after cleanup or a topic re-creation) starts at its offset's file.
            mf = self.queue.get_last_mapped_file(expect)
            self.min_logic_offset = expect
            assert mf is not None
            return mf
        mf = self.queue.get_last_mapped_file(0)
        assert mf is not None
        return mf

    # ------------------------------------------------------------------ reads
    @property
    def max_offset_in_queue(self) -> int:
        files = self.queue.files  # MappedFileQueue.get_max_offset, inline: once per put
        if not files:
            return 0
        last = files[-1]
        return (last.file_from_offset + last.wrote_position) // CQ_STORE_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    def get_index_buffer(self, index: int) -> memoryview | None:
        """Entries from ``index`` to the end of the file holding it."""
        offset = index * CQ_STORE_UNIT_SIZE
        if offset < self.min_logic_offset:
            return None
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            return None
        return mf.view_from(offset - mf.file_from_offset)

    def get_entry(self, index: int) -> tuple[int, int, int] | None:
        buf = self.get_index_buffer(index)
        if buf is None or len(buf) < CQ_STORE_UNIT_SIZE:
            return None
        return CQ_ENTRY.unpack_from(buf, 0)

    def roll_next_file(self, index: int) -> int:
        per_file = self.mapped_file_size // CQ_STORE_UNIT_SIZE
        return index + per_file - index % per_file

    # ------------------------------------------------------------------ cleanup
    def delete_expired(self, cl_min_offset: int) -> int:
        """Delete files whose last entry points below the commit log's minimum offset."""
        doomed: list[MappedFile] = []
        for mf in self.queue.files[:-1]:
            if mf.wrote_position < CQ_STORE_UNIT_SIZE:
                break
            view = mf.raw_view()
            try:
                offset, _, _ = CQ_ENTRY.unpack_from(view, mf.wrote_position - CQ_STORE_UNIT_SIZE)
            finally:
                view.release()
            if offset >= cl_min_offset:
                break
            doomed.append(mf)
        if doomed:
            self.queue.delete_first_files(doomed)
        self.correct_min_offset(cl_min_offset)
        return len(doomed)

    def correct_min_offset(self, cl_min_offset: int) -> None:
        """Move the queue's minimum past entries whose records were cleaned from the commit log."""
        first = self.queue.first
        if first is None:
            return
        start = max(self.min_logic_offset, first.file_from_offset)
        for mf in self.queue.files:
            if mf.file_from_offset + mf.wrote_position <= start:
                continue
            view = mf.raw_view()
            try:
                for pos in range(max(0, start - mf.file_from_offset), mf.wrote_position, CQ_STORE_UNIT_SIZE):
                    offset, size, _ = CQ_ENTRY.unpack_from(view, pos)
                    if offset >= cl_min_offset and size != 0x7FFFFFFF:
                        self.min_logic_offset = mf.file_from_offset + pos
                        return
            finally:
                view.release()
        # Every entry is below the minimum: the queue is logically empty at its end.
        self.min_logic_offset = self.queue.get_max_offset()

    def flush(self, least_pages: int = 0) -> int:
        return self.queue.flush(least_pages)

    def shutdown(self) -> None:
        self.queue.shutdown()

    def destroy(self) -> None:
        self.queue.destroy()
        self.min_logic_offset = 0
        self.max_physic_offset = -1


def _first_past(view: memoryview, count: int, phy_end: int) -> int:
    """Index of the first of ``count`` entries whose record ends past ``phy_end`` (log order;
    fillers, which come first, count as in time)."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) // 2
        offset, size, _ = CQ_ENTRY.unpack_from(view, mid * CQ_STORE_UNIT_SIZE)
        if size != 0x7FFFFFFF and offset + size > phy_end:
            hi = mid
        else:
            lo = mid + 1
    return lo
