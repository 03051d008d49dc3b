"""Recovery at load: RocketMQ's ``DefaultMessageStore.load``/``recover``.

The abort file left by a crash chooses abnormal recovery (re-check the commit log from the
checkpoint's file, re-dispatching every record) over normal recovery (the last three files).
Consume queues are loaded first; a damaged one is set aside and rebuilt, since a queue is derived
data.  Recovery then works out where re-dispatch must start (RocketMQ's reputFromOffset): where
the most advanced queue ends, earlier when a queue fell behind or the key index lost files.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from tidemq.errors import StoreError
from tidemq.index import RecoverableIndex
from tidemq.logs import Progress, human_bytes
from tidemq.message import MessageExt
from tidemq.names import check_stored_topic_name

from .checkpoint import StoreCheckpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueue
from .options import MmapStoreOptions
from .reput import ConsumeQueueTable, Reput, consumable

log = logging.getLogger(__name__)


class StoreRecovery:
    """One load of a store directory; :meth:`run` opens the files and recovers them."""

    def __init__(
        self,
        root: Path,
        options: MmapStoreOptions,
        commitlog: CommitLog,
        checkpoint: StoreCheckpoint,
        cqs: ConsumeQueueTable,
        reput: Reput,
        index: Any | None,
    ) -> None:
        self.root = root
        self.options = options
        self.commitlog = commitlog
        self.checkpoint = checkpoint
        self.cqs = cqs
        self.reput = reput
        self.index = index
        self.rebuild_queues = False  # a damaged or lost consume queue: re-dispatch the whole log
        # Per queue, what the recovery scan saw: [first queue offset, its log offset, last queue offset].
        self._seen: dict[tuple[str, int], list[int]] = {}

    def run(self, last_exit_ok: bool) -> bool:
        """``False`` (the reason logged) when the files cannot be used.

        Progress of each phase (consume queues, commit log, re-dispatch) is logged at INFO every
        few seconds (:func:`tidemq.logs.progress_interval`) and one summary line at the end.
        """
        started = time.monotonic()
        try:
            self.commitlog.queue.load()
            self._load_consume_queues()
        except StoreError as exc:
            log.error("store load failed: %s", exc)
            return False
        if self.index is not None:
            self.index.load(last_exit_ok, self.checkpoint.index_msg_timestamp)
        queues = self.cqs.all_queues()
        cq_progress = Progress("recovery: consume queues", len(queues), unit="queues", logger=log)
        cq_progress.detail = lambda: f"{cq_progress.files} files, {human_bytes(cq_progress.items)} checked"
        for n, cq in enumerate(queues, 1):
            files, checked = cq.recover()
            cq_progress.files += files
            cq_progress.items += checked  # bytes of entries
            cq_progress.update(n)
        cq_progress.finish()
        crc = self.options.check_crc_on_recover
        cl_progress = Progress("recovery: commit log", unit="bytes", logger=log)
        cl_progress.detail = lambda: f"{cl_progress.items} records"
        if last_exit_ok:
            end = self.commitlog.recover_normally(crc, self._note, cl_progress)
        else:
            log.warning("store %s did not exit cleanly: abnormal recovery", self.root)
            min_ts = self.checkpoint.min_timestamp(self.index is not None)
            redispatch = self.reput.redispatch

            def note_and_redispatch(msg: MessageExt) -> None:
                self._note(msg)
                redispatch(msg, msg.commit_log_offset)

            end = self.commitlog.recover_abnormally(min_ts, crc, note_and_redispatch, cl_progress)
        cl_seconds = cl_progress.finish()
        cl_min = self.commitlog.get_min_offset()
        for cq in self.cqs.all_queues():
            cq.truncate_dirty(end)
            cq.correct_min_offset(cl_min)
        queues_from = self._queues_behind(end)
        # A crash that lost the log's tail (an uncommitted transient buffer) leaves index entries
        # for records that are gone and whose offsets new records will reuse: drop them.
        if isinstance(self.index, RecoverableIndex):
            self.index.truncate(end)
        reput_from = self._reput_from(cl_min, queues_from)
        reput_to = self.commitlog.get_max_offset()
        re_progress = Progress("recovery: re-dispatch", max(0, reput_to - reput_from), logger=log)
        re_progress.detail = lambda: f"{re_progress.items} records"
        for offset, msg in self.commitlog.iter_records(reput_from):
            self.reput.redispatch(msg, msg.commit_log_offset)
            re_progress.items += 1
            if re_progress.items % 4096 == 0:
                re_progress.update(offset - reput_from)
        if re_progress.items:
            re_progress.update(re_progress.total)
        re_progress.finish()
        self.reput.reput_from = self.commitlog.get_max_offset()
        seconds = time.monotonic() - started
        rate = cl_progress.done / cl_seconds if cl_seconds > 0 else 0.0
        log.info(
            "store %s loaded in %.2f s (%s): commit log [%d, %d), %d files checked, %s, %d records "
            "(%s/s)%s; %d consume queues, %d files, %s of entries; %d records re-dispatched",
            self.root,
            seconds,
            "clean shutdown" if last_exit_ok else "after a crash",
            cl_min,
            end,
            cl_progress.files,
            human_bytes(cl_progress.done),
            cl_progress.items,
            human_bytes(rate),
            f", {self.commitlog.cut_bytes} bytes cut" if self.commitlog.cut_bytes else "",
            len(queues),
            cq_progress.files,
            human_bytes(cq_progress.items),
            re_progress.items,
        )
        return True

    def _reput_from(self, cl_min: int, queues_from: int | None) -> int:
        """Where re-dispatch starts: what the consume queues or the index have not indexed yet."""
        reput_from = max([cl_min, *(cq.max_physic_offset for cq in self.cqs.all_queues())])
        if queues_from is not None:
            reput_from = min(reput_from, max(cl_min, queues_from))
        if self.rebuild_queues:
            reput_from = cl_min  # re-dispatch is idempotent for the queues that are whole
        index_from = self.index.rebuild_from() if isinstance(self.index, RecoverableIndex) else None
        if index_from is not None:  # index files were unreadable: index their records again
            reput_from = min(reput_from, max(cl_min, index_from))
        return reput_from

    def _note(self, msg: MessageExt) -> None:
        if consumable(msg.sys_flag):
            first = self._seen.get((msg.topic, msg.queue_id))
            if first is None:
                self._seen[(msg.topic, msg.queue_id)] = [
                    msg.queue_offset,
                    msg.commit_log_offset,
                    msg.queue_offset,
                ]
            else:
                first[2] = msg.queue_offset

    def _queues_behind(self, end: int) -> int | None:
        """Compare each queue with the records recovery saw of it; where re-dispatch must start.

        The re-dispatch after load starts where the most advanced queue ends (RocketMQ's
        reputFromOffset), which would leave a queue that lost its files or its last entries
        behind for good, and hand its next message a queue offset already used.  Recovery has
        just read the records of the last files: a queue holding fewer entries than they show is
        caught up from its first record there, or rebuilt from the start of the log when it
        lacks even that one.  Returns the log offset to re-dispatch from (None: no queue behind).
        """
        start: int | None = None
        for (topic, queue_id), (first_qoff, first_phy, last_qoff) in self._seen.items():
            if first_phy >= end:
                continue  # cut with the tail
            cq = self.cqs.find(topic, queue_id)
            have = cq.max_offset_in_queue if cq is not None else 0
            if have > last_qoff:
                continue
            if have >= first_qoff:
                start = first_phy if start is None else min(start, first_phy)
                continue
            log.error(
                "consume queue %s-%d ends at offset %d but the commit log holds its record %d: "
                "rebuilding the consume queues from the commit log",
                topic,
                queue_id,
                have,
                first_qoff,
            )
            self.rebuild_queues = True
        return start

    def _load_consume_queues(self) -> None:
        cq_root = self.cqs.root
        if not cq_root.exists():
            return
        entries = self.options.consumequeue_entries
        for tdir in sorted(cq_root.iterdir()):
            if not tdir.is_dir():
                continue
            problem = check_stored_topic_name(tdir.name)
            if problem:
                log.error("consume queue directory %s ignored: %s", tdir, problem)
                continue
            for qdir in sorted(tdir.iterdir()):
                if not qdir.is_dir() or not qdir.name.lstrip("-").isdigit():
                    continue
                cq = ConsumeQueue(tdir.name, int(qdir.name), cq_root, entries, self.options.file_allocation)
                try:
                    cq.load()
                except StoreError as exc:
                    # A queue is derived data: set the damaged files aside (kept for inspection)
                    # and rebuild the queue from the commit log instead of refusing to start.
                    cq.shutdown()
                    aside = qdir.with_name(f"{qdir.name}.damaged-{time.time_ns()}")
                    qdir.rename(aside)
                    log.error(
                        "consume queue %s-%s is damaged (%s); moved to %s and rebuilt",
                        tdir.name,
                        qdir.name,
                        exc,
                        aside.name,
                    )
                    self.rebuild_queues = True
                    continue
                self.cqs.add(cq)
