"""The ordered files of one log, a commit log or one ConsumeQueue (RocketMQ's ``MappedFileQueue``).

Files are named by their first offset and follow each other without gaps; lookups by offset,
commit and flush across file boundaries, truncation after recovery and deletion of expired files.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from tidemq.errors import StoreError

from .allocate_service import AllocateService
from .mapped_file import MappedFile, file_name
from .transient_pool import TransientStorePool

log = logging.getLogger(__name__)


def _has_data(path: Path) -> bool:
    """Whether a file's first bytes are written (a preallocated file is all zeros)."""
    with open(path, "rb") as f:
        head = f.read(8)
    return head.strip(b"\0") != b""


class MappedFileQueue:
    """The ordered files of one log (a commit log or one ConsumeQueue)."""

    def __init__(
        self,
        directory: Path,
        file_size: int,
        allocator: AllocateService | None = None,
        *,
        pool: TransientStorePool | None = None,
        allocate: str = "sparse",
    ):
        self.directory = Path(directory)
        self.file_size = file_size
        self.allocator = allocator
        self.pool = pool
        self.allocate = allocate  # for files created here, without the allocator
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0  # store time of the data flushed last (checkpoint)
        self._flush_lock = threading.Lock()
        self._files_lock = threading.Lock()

    @property
    def flush_lock(self) -> threading.Lock:
        """Held while a flush records its offsets (a compiled round's outcome takes it too)."""
        return self._flush_lock

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Map the existing files; a file of the wrong size is a :class:`StoreError`."""
        if not self.directory.exists():
            return
        names = sorted(
            p for p in self.directory.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20
        )
        for i, p in enumerate(names):
            # A file's name is its first offset: a name off the file grid or a missing file in the
            # sequence would put records at offsets they were not written for.  Refuse; never delete.
            start = int(p.name)
            if start % self.file_size:
                raise StoreError(
                    f"{p}: the name is not a multiple of the file size {self.file_size} "
                    "(a stray file or a different file size setting); move it away"
                )
            if i and start != int(names[i - 1].name) + self.file_size:
                raise StoreError(
                    f"{p}: does not follow {names[i - 1].name} (a gap: "
                    f"{(start - int(names[i - 1].name)) // self.file_size - 1} file(s) missing)"
                )
            size = p.stat().st_size
            if size == 0:
                # An allocation interrupted by a crash: nothing was ever written there, nor in the
                # files preallocated after it (a file is written only once the one before is full).
                later = names[i + 1 :]
                if any(_has_data(q) for q in later):
                    raise StoreError(f"{p}: empty file followed by files holding data")
                for q in (p, *later):
                    q.unlink()
                if later:
                    log.warning(
                        "%s: removed an interrupted allocation and %d empty files after it", p, len(later)
                    )
                break
            if size != self.file_size:
                raise StoreError(f"{p}: size {size} does not match the configured file size {self.file_size}")
            mf = MappedFile(p, self.file_size)
            mf.set_positions(self.file_size)
            self.files.append(mf)

    # ------------------------------------------------------------------ lookup
    @property
    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    @property
    def first(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, create: bool = True) -> MappedFile | None:
        """The file being appended to, creating the next one when the last is full."""
        last = self.last
        if last is not None and not last.is_full():
            return last
        if not create:
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.file_size
        else:
            create_offset = last.file_from_offset + self.file_size
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / file_name(create_offset)
        if self.allocator is not None:
            nxt = self.directory / file_name(create_offset + self.file_size)
            mf = self.allocator.get(path, nxt, self.file_size)
        else:
            mf = MappedFile(path, self.file_size, pool=self.pool, allocate=self.allocate)
        with self._files_lock:
            if not self.files:
                self.flushed_where = self.committed_where = create_offset
            self.files.append(mf)
        return mf

    def find_mapped_file_by_offset(
        self, offset: int, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        first = files[0]
        idx = (offset - first.file_from_offset) // self.file_size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        for mf in files:  # holes are not expected; stay correct if one appears
            if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                return mf
        return first if return_first_on_not_found else None

    def get_min_offset(self) -> int:
        first = self.first
        return first.file_from_offset if first is not None else 0

    def get_max_offset(self) -> int:
        """End of the readable data."""
        last = self.last
        return last.file_from_offset + last.read_position if last is not None else 0

    def get_max_wrote_position(self) -> int:
        last = self.last
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def how_much_fall_behind(self) -> int:
        return self.get_max_wrote_position() - self.flushed_where

    # ------------------------------------------------------------------ flush / commit
    def commit(self, least_pages: int = 0) -> int:
        with self._flush_lock:
            while True:
                mf = self.find_mapped_file_by_offset(self.committed_where, self.committed_where == 0)
                if mf is None:
                    return self.committed_where
                where = mf.file_from_offset + mf.commit(least_pages)
                moved = where != self.committed_where
                self.committed_where = where
                # Keep going into the next file when this one is done (a batch may straddle).
                if not (moved and mf.committed_position >= self.file_size):
                    return where

    def flush(self, least_pages: int = 0) -> int:
        """Flush from ``flushed_where``; crosses into the next file when the current one is done."""
        with self._flush_lock:
            while True:
                mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
                if mf is None:
                    return self.flushed_where
                ts = mf.store_timestamp  # read before the position: never newer than the data flushed
                where = mf.file_from_offset + mf.flush(least_pages)
                moved = where != self.flushed_where
                self.flushed_where = where
                if moved and ts:
                    self.store_timestamp = ts
                if not (moved and mf.flushed_position >= self.file_size):
                    return where

    def flush_calls(self) -> int:
        return sum(mf.flush_calls for mf in self.files)

    # ------------------------------------------------------------------ truncation / deletion
    def truncate_dirty_files(self, offset: int) -> None:
        """Drop everything at or past ``offset`` (recovery, and truncation on a live store)."""
        with self._flush_lock:  # a flush running meanwhile would move flushed_where past the cut
            self._truncate_dirty_files(offset)

    def _truncate_dirty_files(self, offset: int) -> None:
        keep: list[MappedFile] = []
        for mf in self.files:
            end = mf.file_from_offset + self.file_size
            if end > offset:
                if offset >= mf.file_from_offset:
                    pos = offset - mf.file_from_offset
                    # Zero the cut tail so a later scan cannot mistake stale bytes for records.
                    mf.zero_tail(pos)
                    mf.set_positions(pos)
                    keep.append(mf)
                else:
                    mf.destroy()
            else:
                keep.append(mf)
        with self._files_lock:
            self.files = keep
        self.flushed_where = self.committed_where = offset

    def delete_first_files(self, to_delete: list[MappedFile]) -> None:
        doomed = {id(m) for m in to_delete}
        with self._files_lock:
            self.files = [m for m in self.files if id(m) not in doomed]
        for m in to_delete:
            m.destroy()

    def delete_expired_by_time(
        self,
        expired_ms: float,
        now_ms: float,
        clean_immediately: bool,
        max_files: int,
        interval_s: float = 0.0,
    ) -> int:
        """Delete files last modified more than ``expired_ms`` ago (never the active file)."""
        files = self.files[:-1]
        doomed: list[MappedFile] = []
        for mf in files:
            if len(doomed) >= max_files:
                break
            if now_ms >= mf.last_modified() * 1000 + expired_ms or clean_immediately:
                doomed.append(mf)
            else:
                break  # files age in order; stop at the first young one
        if doomed:
            self.delete_first_files(doomed)
        return len(doomed)

    def shutdown(self) -> None:
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.flushed_where = self.committed_where = 0
        try:
            self.directory.rmdir()
        except OSError:
            pass
