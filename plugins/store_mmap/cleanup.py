"""The store's service thread: RocketMQ's ``CleanCommitLogService``, ``CleanConsumeQueueService``
and ``FlushConsumeQueueService`` (inner classes of DefaultMessageStore there).

One thread runs them all: each tick it checks the disk (cheap, so writes are refused within a
tick of the disk filling up), and at their own intervals flushes the metadata (consume queues,
index, checkpoint) and deletes expired files.
"""

from __future__ import annotations

import errno
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from tidemq.delay import SCHEDULE_TOPIC
from tidemq.store import PutResult, PutStatus
from tidemq.threads import name_this_thread

from .checkpoint import StoreCheckpoint
from .commitlog import CommitLog
from .consume_queue import CQ_ENTRY, CQ_STORE_UNIT_SIZE, ConsumeQueue
from .options import MmapStoreOptions
from .reput import ConsumeQueueTable

log = logging.getLogger(__name__)


class FlushConsumeQueueService:
    """Flushes the consume queues and the index, then records how far they are in the checkpoint."""

    def __init__(self, commitlog: CommitLog, cqs: ConsumeQueueTable, index: Any | None) -> None:
        self.commitlog = commitlog
        self.cqs = cqs
        self.index = index
        self.checkpoint: StoreCheckpoint | None = None  # opened by the store's load

    def flush(self, thorough: bool, index: bool = True, least_pages: int = 2) -> None:
        """Flush the queues (``thorough``: every dirty page, else only queues with ``least_pages``
        dirty), the index when ``index``, then the checkpoint, which advances only the times of
        what was made durable: the logics time only in a thorough flush (RocketMQ's
        FlushConsumeQueueService)."""
        logics_ts = self.cqs.last_entry_ts  # read before flushing: every entry up to it is then on disk
        for cq in self.cqs.all_queues():
            cq.flush(0 if thorough else least_pages)
        cp = self.checkpoint
        if cp is None:
            return
        if self.commitlog.store_timestamp:
            cp.physic_msg_timestamp = self.commitlog.store_timestamp
        if logics_ts and thorough:
            cp.logics_msg_timestamp = logics_ts
        if index and self.index is not None:
            ts = self.index.flush()
            if ts:
                cp.index_msg_timestamp = ts
        # Written with what it records: the logics time (thorough) or the index time moved, or a
        # time was lowered.  The commit log's time alone does not move where recovery starts
        # (the smallest of the times: the logics time waits for the next thorough flush), so it
        # is not worth a sync (and its device cache flush) beside the rounds every second.
        if thorough or index or cp.lowered():
            cp.flush()


class CleanService:
    """Disk checks and the deletion of expired commit-log files, queue entries and index files."""

    def __init__(
        self,
        root: Path,
        options: MmapStoreOptions,
        commitlog: CommitLog,
        cqs: ConsumeQueueTable,
        lock: threading.Lock,
        index: Any | None,
        flusher: FlushConsumeQueueService,
    ) -> None:
        self.root = root
        self.options = options
        self.commitlog = commitlog
        self.cqs = cqs
        self._lock = lock  # the store's: queues are listed under it
        self.index = index
        self.flusher = flusher
        #: Why writes are refused ("" while the disk has room); the put path reads it.
        self.disk_full = ""

    def run(self, stop: threading.Event) -> None:
        """The service loop, until ``stop`` is set."""
        name_this_thread()
        flush_every = self.options.cq_flush_interval_ms / 1000
        index_every = self.options.index_flush_interval_ms / 1000
        clean_every = self.options.clean_interval_ms / 1000
        thorough_every = self.options.cq_flush_thorough_interval_ms / 1000
        least_pages = self.options.cq_flush_least_pages
        next_flush = time.monotonic() + flush_every
        next_thorough = time.monotonic() + thorough_every
        next_index_flush = time.monotonic() + index_every
        next_clean = time.monotonic() + clean_every
        flush_failing = False
        while not stop.wait(min(flush_every, clean_every, 0.5)):
            now = time.monotonic()
            try:
                # Cheap (statvfs): writes are refused within a tick of the disk filling up, and
                # accepted again within a tick of space coming back, whatever the cleanup period.
                self.check_disk()
            except OSError as exc:
                log.error("cannot check the disk: %s", exc)
            if now >= next_flush:
                next_flush = now + flush_every
                with_index = now >= next_index_flush
                if with_index:
                    next_index_flush = now + index_every
                thorough = least_pages == 0 or now >= next_thorough
                if thorough:
                    next_thorough = now + thorough_every
                try:
                    self.flusher.flush(thorough=thorough, index=with_index, least_pages=least_pages)
                    if flush_failing:
                        log.warning("store metadata flushed again")
                    flush_failing = False
                except OSError as exc:
                    # ENOSPC on the checkpoint and the like: retried next round, logged once.
                    if not flush_failing:
                        log.error("cannot flush store metadata (will retry): %s", exc)
                    flush_failing = True
                except Exception:
                    log.exception("store metadata flush failed")
            if now >= next_clean:
                next_clean = now + clean_every
                try:
                    self.clean_expired()
                except Exception:
                    log.exception("store cleanup round failed")

    # ------------------------------------------------------------------ puts refused by the disk
    def write_failed(self, file_name: str, exc: OSError) -> PutResult:
        """A commit-log write failed (ENOSPC on a sparse file, EIO): nothing is published."""
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        error = f"{'the disk is full: ' if full else ''}cannot write {file_name} ({exc.strerror or exc})"
        log.error("put refused: %s", error)
        try:
            self.check_disk()
        except OSError:
            pass
        return PutResult(PutStatus.DISK_FULL if full else PutStatus.UNKNOWN_ERROR, error=error)

    def create_failed(self, exc: OSError) -> PutResult:
        """A store file could not be created (disk full...): a clear status, the store stays up."""
        what = Path(exc.filename).name if exc.filename else "a store file"
        reason = exc.strerror or str(exc)
        error = (
            f"the disk is full: cannot write {what} ({reason})"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"cannot create or write {what}: {reason}"
        )
        log.error("put refused: %s", error)
        try:
            self.check_disk()  # a full disk then answers DISK_FULL at once, until space returns
        except OSError:
            pass
        return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, error=error)

    # ------------------------------------------------------------------ disk and cleanup
    def disk_used_ratio(self) -> float:
        usage = shutil.disk_usage(self.root)
        return usage.used / usage.total * 100 if usage.total else 0.0

    def check_disk(self) -> float:
        """Refuse (or accept again) writes by the disk's fill ratio; returns the ratio in percent."""
        ratio = self.disk_used_ratio()
        limit = self.options.disk_space_warning_ratio
        if ratio > limit:
            if not self.disk_full:
                log.error(
                    "disk %.1f%% full (limit %d%%): refusing writes until cleanup frees space", ratio, limit
                )
            self.disk_full = f"the disk is {ratio:.1f}% full (limit {limit}%); writes are refused"
        elif self.disk_full:
            log.warning("disk back to %.1f%% full: accepting writes", ratio)
            self.disk_full = ""
        return ratio

    def clean_expired(self, *, manual: bool = False, now: float | None = None) -> int:
        """Delete expired commit-log files, then the queue entries and index files below them.

        Runs at the ``delete_when`` hours, at any hour once the disk passes
        ``disk_max_used_space_ratio`` or when ``manual``; past ``disk_clean_forcibly_ratio`` it
        deletes the oldest files even if they have not expired.  Returns the files deleted.
        """
        opts = self.options
        now_s = time.time() if now is None else now
        hours = {int(h) for h in opts.delete_when.split(";") if h.strip()}
        ratio = self.check_disk()
        is_time = time.localtime(now_s).tm_hour in hours
        space = ratio > opts.disk_max_used_space_ratio
        immediately = ratio > opts.disk_clean_forcibly_ratio
        if not (is_time or space or manual):
            return 0
        if space:
            log.warning(
                "disk %.1f%% used (limit %d%%): cleaning commit-log files",
                ratio,
                opts.disk_max_used_space_ratio,
            )
        deleted = self.commitlog.queue.delete_expired_by_time(
            opts.file_reserved_hours * 3600 * 1000, now_s * 1000, immediately, opts.delete_files_batch_max
        )
        if deleted:
            self.clean_consume_queues()
            self.check_disk()
        return deleted

    def clean_consume_queues(self) -> None:
        cl_min = self.commitlog.get_min_offset()
        with self._lock:
            queues = self.cqs.all_queues()
        for cq in queues:
            cq.delete_expired(cl_min)
        if self.index is not None:
            self.index.delete_expired(cl_min)

    def clean_expired_queues(self) -> int:
        """Destroy the queues whose every entry points below the commit log's minimum offset.

        RocketMQ's ``cleanExpiredConsumerQueue`` (CLEAN_EXPIRED_CONSUMEQUEUE): a queue all of whose
        records were deleted with their commit-log files is dropped, files and all, so a topic that
        is no longer written stops costing files and memory.  A queue that is written again
        starts from offset 0, as in RocketMQ.  The delay queues are kept (their offsets are the
        schedule's progress).  Returns the queues destroyed.
        """
        destroyed = 0
        with self._lock:  # the write path creates and fills queues under it
            cl_min = self.commitlog.get_min_offset()
            for topic, queues in list(self.cqs.queues.items()):
                if topic == SCHEDULE_TOPIC:
                    continue
                for queue_id, cq in list(queues.items()):
                    end = _last_entry_end(cq)
                    if end < 0:  # no entry yet: created just now
                        continue
                    if end <= cl_min:
                        log.info(
                            "clean expired queue %s/%d: its last record ends at %d, the commit log starts at %d",
                            topic,
                            queue_id,
                            end,
                            cl_min,
                        )
                        cq.destroy()
                        del queues[queue_id]
                        destroyed += 1
                if not queues:
                    self.cqs.delete_topics([topic])  # the empty directory too
        return destroyed


def _last_entry_end(cq: ConsumeQueue) -> int:
    """Commit-log offset just past the queue's last record, -1 when it has none."""
    files = cq.queue.files
    if not files or files[-1].wrote_position < CQ_STORE_UNIT_SIZE:
        return -1
    mf = files[-1]
    view = mf.raw_view()
    try:
        offset, size, _ = CQ_ENTRY.unpack_from(view, mf.wrote_position - CQ_STORE_UNIT_SIZE)
    finally:
        view.release()
    return offset + size
