"""Offline verifier of an ``mmap`` store directory: ``tidemq store verify <data-dir>``.

It reads the files read-only (a running broker may keep writing) and checks that

* the CommitLog is a contiguous run of records with valid sizes, magic codes, body CRCs and
  self-describing physical offsets, each file ending in a BLANK record, and that every queue's
  records carry consecutive queue offsets (a duplicated or skipped queue offset is an error);
* every ConsumeQueue entry points at the start of a record of that topic and queue, with the
  record's size, queue offset and tag hash, and every consumable record has its entry;
* every entry of the key index points at a record one of whose keys it may index.  The index
  reads its own files (:class:`tidemq.index.VerifiableIndex`, which the ``hash`` index
  implements); it is the broker's default index plugin, built through the plugin manager, or the
  one the caller passes.

Findings come in two kinds.  *Errors* are inconsistencies in data a broker would serve.
*Repairable* findings are what a crash leaves and the next load fixes (a torn record after the
last whole one, queue or index entries beyond the end of the log, queue entries not written
yet); with ``strict`` (a store that was shut down cleanly, or that recovery has run on) they
count as errors too.  Record decoding is :func:`tidemq.message.decode_message`'s.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from tidemq.config import DEFAULT_PLUGINS
from tidemq.datadir import holder
from tidemq.delay import SCHEDULE_TOPIC, delay_level_in
from tidemq.errors import CorruptDataError, StoreError, TidemqError
from tidemq.index import IndexFileInfo, VerifiableIndex
from tidemq.logs import Progress, ProgressFactory, human_bytes, log_progress
from tidemq.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    decode_message,
    tags_hash_code,
)

from .commitlog import written_extent
from .consume_queue import CQ_ENTRY, CQ_STORE_UNIT_SIZE

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">iI")
_BLANK_CQ_SIZE = 0x7FFFFFFF
#: Problems kept verbatim in a report; beyond that they are only counted.
MAX_LISTED = 50
#: How far past the end of the valid data a torn record is looked for (largest record + slack).
TAIL_WINDOW = 4 * 1024 * 1024 + 128 * 1024
#: Records (or entries) between two progress updates.
_PROGRESS_STEP = 4096


class VerifyError(StoreError):
    """The directory is not a store this verifier can read."""


@attrs.define
class VerifyReport:
    """What :func:`verify_store` found; ``ok`` when nothing a broker would serve is wrong."""

    data_dir: str
    strict: bool
    #: Who holds the directory's lock when the store is live (``"pid 12 (tidemq broker a)"``).
    live: str | None = None
    commitlog_files: int = 0
    commitlog_min_offset: int = 0
    commitlog_end_offset: int = 0  # end of the last whole record
    records: int = 0
    consumable_records: int = 0
    torn_tail_bytes: int = 0  # non-zero bytes after the last whole record (a crash's torn write)
    queues: int = 0
    cq_entries: int = 0
    cq_missing: int = 0  # consumable records without their queue entry yet
    cq_beyond_end: int = 0  # queue entries pointing past the end of the log
    index_files: int = 0
    index_entries: int = 0
    index_beyond_end: int = 0
    expired_entries: int = 0  # queue/index entries below the log's minimum offset (cleaned)
    error_count: int = 0
    repairable_count: int = 0
    errors: list[str] = attrs.field(factory=list)
    repairable: list[str] = attrs.field(factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and (not self.strict or self.repairable_count == 0)

    def error(self, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_LISTED:
            self.errors.append(message)
        log.error("%s", message)

    def repair(self, message: str) -> None:
        self.repairable_count += 1
        if len(self.repairable) < MAX_LISTED:
            self.repairable.append(message)
        log.warning("%s", message)

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["ok"] = self.ok
        return out


def _consumable(sys_flag: int) -> bool:
    return sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)


class _Files:
    """Read-only maps of files named by their 20-digit starting offset (commit log, one queue)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.paths = sorted(
            p for p in directory.iterdir() if p.is_file() and p.name.isdigit() and len(p.name) == 20
        )
        self.starts = [int(p.name) for p in self.paths]
        self._maps: dict[int, mmap.mmap | bytes] = {}

    def raw(self, i: int) -> mmap.mmap | bytes:
        """File ``i`` mapped read-only (an empty file is ``b""``)."""
        m = self._maps.get(i)
        if m is None:
            with open(self.paths[i], "rb") as f:
                size = os.fstat(f.fileno()).st_size
                m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else b""
            self._maps[i] = m
        return m

    def view(self, i: int) -> memoryview:
        """A view of file ``i``; release it when done so the map can be closed."""
        return memoryview(self.raw(i))

    def size(self, i: int) -> int:
        return len(self.raw(i))

    def locate(self, offset: int) -> tuple[int, int] | None:
        """(file index, position) of ``offset``, or ``None`` when no file holds it."""
        lo, hi = 0, len(self.starts) - 1
        found = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.starts[mid] <= offset:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        if found < 0:
            return None
        pos = offset - self.starts[found]
        return (found, pos) if pos < self.size(found) else None

    def written(self, i: int) -> int:
        """Bytes written in file ``i`` (its allocated rest is zeros): what progress counts."""
        with open(self.paths[i], "rb") as f:
            return written_extent(self.raw(i), 0, f.fileno())

    def close(self) -> None:
        for m in self._maps.values():
            if isinstance(m, mmap.mmap):
                try:
                    m.close()
                except BufferError:  # a view still alive; the map goes with the process
                    pass
        self._maps.clear()


class StoreVerifier:
    """Walks one store directory; :meth:`run` returns the :class:`VerifyReport`."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        strict: bool | None = None,
        check_index: bool = True,
        index: VerifiableIndex | None = None,
        progress: ProgressFactory | None = None,
    ) -> None:
        self.root = Path(data_dir)
        if not (self.root / "commitlog").is_dir():
            raise VerifyError(f"{self.root} is not an mmap store directory (no commitlog/ in it)")
        crashed = (self.root / "abort").exists()
        self.report = VerifyReport(str(self.root), strict=(not crashed) if strict is None else strict)
        # Read-only, so a live store may be walked; its newest records are in flight.
        self.report.live = holder(self.root)
        self.check_index = check_index
        self.index = index
        self.log_files = _Files(self.root / "commitlog")
        self._cqs: dict[tuple[str, int], _Files | None] = {}
        # Each phase's progress, measured in what the files hold (never their allocated size).
        self.progress = progress or log_progress(log, "verify: ")

    # ------------------------------------------------------------------ public
    def run(self) -> VerifyReport:
        started = time.monotonic()
        try:
            self._walk_commitlog()
            self._walk_consume_queues()
            if self.check_index:
                self._walk_index()
        finally:
            self.log_files.close()
            for files in self._cqs.values():
                if files is not None:
                    files.close()
        self.report.seconds = round(time.monotonic() - started, 3)
        r = self.report
        log.info(
            "verify %s: %d records, %d queue entries, %d index entries; %d errors, %d repairable",
            self.root,
            r.records,
            r.cq_entries,
            r.index_entries,
            r.error_count,
            r.repairable_count,
        )
        return r

    # ------------------------------------------------------------------ records
    def record_at(self, offset: int) -> MessageExt | str:
        """The record starting at ``offset`` (CRC checked), or why there is none."""
        loc = self.log_files.locate(offset)
        if loc is None:
            return "no commit-log file holds it"
        view = self.log_files.view(loc[0])
        try:
            msg = decode_message(view, loc[1], check_crc=True, with_body=False)
        except CorruptDataError as exc:
            return str(exc)
        finally:
            view.release()
        if msg.commit_log_offset != offset:
            return f"the record there claims offset {msg.commit_log_offset}"
        return msg

    # ------------------------------------------------------------------ commit log
    def _walk_commitlog(self) -> None:
        r = self.report
        files = self.log_files
        r.commitlog_files = len(files.paths)
        if not files.paths:
            return
        file_size = files.size(0)
        r.commitlog_min_offset = files.starts[0]
        end = files.starts[0]
        last_qoff: dict[tuple[str, int], int] = {}
        # Files after the last one holding data were preallocated (AllocateService) before the
        # crash; recovery drops them, so the log's end is in the last file with data.
        data_last = 0
        for i in range(len(files.starts)):
            if files.size(i) >= 8 and files.raw(i)[:8] != bytes(8):
                data_last = i
        # Bytes present: whole files up to the last one holding data, then its written part.
        present = data_last * file_size + files.written(data_last)
        progress = self.progress("commit log", present, "bytes")
        progress.detail = lambda: f"{r.records} records"
        checked = 0  # bytes of the files done
        for i, start in enumerate(files.starts):
            if i > data_last:
                break
            last = i == data_last
            if i and start != files.starts[i - 1] + file_size:
                r.error(f"commit log: file {files.paths[i].name} does not follow the previous file (gap)")
            size = files.size(i)
            if size != file_size and not (last and size == 0):
                r.error(f"commit log: file {files.paths[i].name} is {size} bytes, others {file_size}")
            view = files.view(i)
            pos = 0
            ended = False
            while pos + 8 <= size:
                total, magic = _HEAD.unpack_from(view, pos)
                where = start + pos
                if magic == BLANK_MAGIC_CODE and total == size - pos:
                    pos = size
                    break
                if magic != MESSAGE_MAGIC_CODE or total <= 0:
                    ended = True
                    break
                try:
                    msg = decode_message(view, pos, check_crc=False, with_body=False)
                except CorruptDataError as exc:
                    if last:
                        ended = True
                        break
                    r.error(f"commit log: unreadable record at {where}: {exc}; rest of the file skipped")
                    pos = size
                    break
                if msg.commit_log_offset != where:
                    if last:
                        ended = True
                        break
                    r.error(f"commit log: record at {where} claims offset {msg.commit_log_offset}")
                try:
                    decode_message(view, pos, check_crc=True, with_body=False)
                except CorruptDataError as exc:
                    # The sizes hold, so the walk goes on; a queue entry pointing here is an error too.
                    r.error(
                        f"commit log: {exc} (topic {msg.topic}, queue {msg.queue_id}, "
                        f"queue offset {msg.queue_offset})"
                    )
                r.records += 1
                if _consumable(msg.sys_flag):
                    r.consumable_records += 1
                    key = (msg.topic, msg.queue_id)
                    prev = last_qoff.get(key)
                    if prev is not None and msg.queue_offset != prev + 1:
                        kind = "duplicated" if msg.queue_offset <= prev else "skipped"
                        r.error(
                            f"commit log: {kind} queue offset in {msg.topic}-{msg.queue_id}: record at "
                            f"{where} has queue offset {msg.queue_offset} after {prev}"
                        )
                    last_qoff[key] = msg.queue_offset
                    self._check_cq_entry_of(msg, where)
                pos += total
                if r.records % _PROGRESS_STEP == 0:
                    progress.update(checked + pos)
            end = start + pos
            checked += pos if last else size
            progress.update(checked)
            if ended or pos < size:
                if not last:
                    r.error(
                        f"commit log: file {files.paths[i].name} ends at {pos} without a BLANK record "
                        "(data after it is unreachable)"
                    )
                    view.release()
                    continue
                tail = bytes(view[pos : min(size, pos + TAIL_WINDOW)])
                torn = len(tail.rstrip(b"\0")) if tail.strip(b"\0") else 0
                if torn:
                    r.torn_tail_bytes = torn
                    r.repair(f"commit log: {torn} bytes of a torn record after offset {end}")
            view.release()
        r.commitlog_end_offset = end
        progress.update(max(checked, present))  # the torn tail after the last record was read too
        self._done(progress, f"{r.records} records")

    def _check_cq_entry_of(self, msg: MessageExt, where: int) -> None:
        """The queue entry at the record's queue offset must point back at it."""
        entry = self._cq_entry(msg.topic, msg.queue_id, msg.queue_offset)
        if entry is None or entry[1] <= 0:
            self.report.cq_missing += 1
            self.report.repair(
                f"consume queue {msg.topic}-{msg.queue_id}: no entry {msg.queue_offset} for the record at {where}"
            )
            return
        offset, size, _tags = entry
        if (offset, size) != (where, msg.store_size):
            self.report.error(
                f"consume queue {msg.topic}-{msg.queue_id}: entry {msg.queue_offset} points at "
                f"({offset}, {size}), the record is at ({where}, {msg.store_size})"
            )

    # ------------------------------------------------------------------ consume queues
    def _cq_files(self, topic: str, queue_id: int) -> _Files | None:
        key = (topic, queue_id)
        if key not in self._cqs:
            d = self.root / "consumequeue" / topic / str(queue_id)
            self._cqs[key] = _Files(d) if d.is_dir() else None
        return self._cqs[key]

    def _cq_entry(self, topic: str, queue_id: int, index: int) -> tuple[int, int, int] | None:
        files = self._cq_files(topic, queue_id)
        if files is None:
            return None
        loc = files.locate(index * CQ_STORE_UNIT_SIZE)
        if loc is None:
            return None
        raw = files.raw(loc[0])
        if loc[1] + CQ_STORE_UNIT_SIZE > len(raw):
            return None
        return CQ_ENTRY.unpack_from(raw, loc[1])

    def _queue_dirs(self) -> Iterator[tuple[str, int]]:
        root = self.root / "consumequeue"
        if not root.is_dir():
            return
        for topic_dir in sorted(root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if qdir.is_dir() and qdir.name.lstrip("-").isdigit():
                    yield topic_dir.name, int(qdir.name)

    def _done(self, progress: Progress, what: str) -> None:
        seconds = progress.finish()
        log.info(
            "verify: %s: %s checked, %s, in %.1f s",
            progress.what,
            human_bytes(progress.done) if progress.unit == "bytes" else f"{progress.done} {progress.unit}",
            what,
            seconds,
        )

    def _walk_consume_queues(self) -> None:
        r = self.report
        queues = [(key, f) for key in self._queue_dirs() if (f := self._cq_files(*key)) is not None]
        # Bytes present: the written entries of each file (queue files are sparse or preallocated).
        extents = {key: [f.written(i) for i in range(len(f.paths))] for key, f in queues}
        progress = self.progress("consume queues", sum(sum(e) for e in extents.values()), "bytes")
        progress.detail = lambda: f"{r.cq_entries} entries"
        checked = 0
        for (topic, queue_id), files in queues:
            r.queues += 1
            for i, start in enumerate(files.starts):
                view = files.view(i)
                pos = 0
                done = False
                while pos + CQ_STORE_UNIT_SIZE <= len(view):
                    offset, size, tags = CQ_ENTRY.unpack_from(view, pos)
                    if offset < 0 or size <= 0:
                        done = True  # the queue's end, as recovery reads it
                        break
                    index = (start + pos) // CQ_STORE_UNIT_SIZE
                    pos += CQ_STORE_UNIT_SIZE
                    if size == _BLANK_CQ_SIZE:
                        continue
                    r.cq_entries += 1
                    self._check_cq_entry(topic, queue_id, index, offset, size, tags)
                    if r.cq_entries % _PROGRESS_STEP == 0:
                        progress.update(checked + pos)
                view.release()
                checked += extents[(topic, queue_id)][i]
                progress.update(checked)
                if done:
                    checked += sum(extents[(topic, queue_id)][i + 1 :])
                    break
        self._done(progress, f"{r.cq_entries} entries in {r.queues} queues")

    def _check_cq_entry(
        self, topic: str, queue_id: int, index: int, offset: int, size: int, tags: int
    ) -> None:
        r = self.report
        name = f"consume queue {topic}-{queue_id} entry {index}"
        if offset < r.commitlog_min_offset:
            r.expired_entries += 1
            return
        if offset + size > r.commitlog_end_offset:
            r.cq_beyond_end += 1
            r.repair(f"{name} points at {offset}, past the end of the log ({r.commitlog_end_offset})")
            return
        msg = self.record_at(offset)
        if isinstance(msg, str):
            r.error(f"{name} points at {offset}, not a valid record: {msg}")
            return
        want = (topic, queue_id, index, size, tags)
        expected_tags = tags_hash_code(msg.tags)
        if msg.topic == SCHEDULE_TOPIC and delay_level_in(msg.properties) > 0 and tags > msg.store_timestamp:
            # The delivery time (store time + the level's delay, levels from the broker's config).
            expected_tags = tags
        got = (msg.topic, msg.queue_id, msg.queue_offset, msg.store_size, expected_tags)
        if want != got:
            r.error(
                f"{name} (size {size}, tag hash {tags}) points at the record of {msg.topic}-{msg.queue_id} "
                f"queue offset {msg.queue_offset} (size {msg.store_size}, tag hash {got[4]})"
            )

    # ------------------------------------------------------------------ key index
    def _default_index(self) -> VerifiableIndex | None:
        """The broker's default index plugin over this directory (never loaded: read-only)."""
        from tidemq.plugins import get_plugin_manager

        name = DEFAULT_PLUGINS["index"]
        try:
            index = get_plugin_manager().create("index", name, data_dir=self.root)
        except TidemqError as exc:
            log.warning("verify: no %r index plugin (%s); index files not checked", name, exc)
            return None
        if not isinstance(index, VerifiableIndex):
            log.warning("verify: the %r index cannot be verified; index files not checked", name)
            return None
        return index

    def _walk_index(self) -> None:
        index = self.index if self.index is not None else self._default_index()
        if index is None:
            return
        r = self.report
        progress = self.progress("index", 0, "entries")
        try:
            self._walk_index_entries(index, progress)
        finally:
            self._done(progress, f"{r.index_files} files")

    def _walk_index_entries(self, index: VerifiableIndex, progress: Progress) -> None:
        r = self.report
        for item in index.walk_files():
            if isinstance(item, IndexFileInfo):
                r.index_files += 1
                for problem in item.problems:
                    r.repair(problem)
                progress.add_total(item.entry_count)
                continue
            idx, phy = item.number, item.phy_offset
            r.index_entries += 1
            if r.index_entries % _PROGRESS_STEP == 0:
                progress.update(r.index_entries)
            if item.problem:
                r.error(item.problem)
            if phy < r.commitlog_min_offset:
                r.expired_entries += 1
                continue
            if phy >= r.commitlog_end_offset:
                r.index_beyond_end += 1
                r.repair(f"index file {item.file}: entry {idx} points past the end of the log ({phy})")
                continue
            msg = self.record_at(phy)
            if isinstance(msg, str):
                r.error(f"index file {item.file}: entry {idx} points at {phy}, not a record: {msg}")
                continue
            keys = [k for k in (msg.uniq_key, *msg.keys) if k]
            if not index.entry_matches(item, msg.topic, keys):
                r.error(
                    f"index file {item.file}: entry {idx} (hash {item.key_hash}) points at the record at "
                    f"{phy} whose keys {keys[:4]} hash otherwise"
                )
        progress.update(r.index_entries)


def verify_store(
    data_dir: Path | str,
    *,
    strict: bool | None = None,
    check_index: bool = True,
    index: VerifiableIndex | None = None,
    progress: ProgressFactory | None = None,
) -> VerifyReport:
    """Verify the store in ``data_dir``; ``strict`` defaults to "the store was shut down cleanly".

    ``index``: the key index whose files to check (default: the broker's default index plugin).
    ``progress``: how each phase reports progress (default: INFO lines every few seconds).
    """
    verifier = StoreVerifier(data_dir, strict=strict, check_index=check_index, index=index, progress=progress)
    return verifier.run()


# ---------------------------------------------------------------------------- command line


def store_command() -> Any:
    """The ``tidemq store`` command group (built lazily: click is only needed by the CLI)."""
    import click
    import orjson

    @click.group("store")
    def store() -> None:
        """Offline tools for mmap store directories."""

    @store.command("verify")
    @click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
    @click.option(
        "--strict/--no-strict",
        default=None,
        help="Count what recovery would repair as errors (default: only when the store exited cleanly).",
    )
    @click.option("--no-index", is_flag=True, help="Skip the index files.")
    @click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
    @click.option(
        "--no-progress",
        is_flag=True,
        help="No progress bars (there are none either when stderr is not a terminal): "
        "INFO log lines every 2 s ($TIDEMQ_PROGRESS_EVERY) instead.",
    )
    def verify(data_dir: str, strict: bool | None, no_index: bool, as_json: bool, no_progress: bool) -> None:
        """Check CommitLog records, ConsumeQueues and the index of a store; exit 1 on errors.

        Progress is measured in the bytes the files hold (not their allocated size), on stderr.
        """
        import sys

        from tidemq.logs import RichBars

        try:
            if no_progress or not sys.stderr.isatty():
                report = verify_store(data_dir, strict=strict, check_index=not no_index)
            else:
                with RichBars() as bars:
                    report = verify_store(
                        data_dir, strict=strict, check_index=not no_index, progress=bars.factory()
                    )
        except VerifyError as exc:
            click.echo(f"tidemq: error: {exc}", err=True)
            raise SystemExit(2) from None
        if report.live:
            click.echo(
                f"tidemq: note: {report.data_dir} is live (in use by {report.live}): records being "
                "written now may show as repairable",
                err=True,
            )
        if as_json:
            click.echo(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode())
        else:
            click.echo(
                f"{report.data_dir}: {report.records} records in {report.commitlog_files} commit-log files "
                f"[{report.commitlog_min_offset}, {report.commitlog_end_offset}), {report.cq_entries} entries "
                f"in {report.queues} consume queues, {report.index_entries} index entries"
            )
            for line in report.errors:
                click.echo(f"error: {line}")
            for line in report.repairable:
                click.echo(f"repairable: {line}")
            verdict = "OK" if report.ok else "FAILED"
            click.echo(
                f"{verdict}: {report.error_count} errors, {report.repairable_count} repairable "
                f"({'strict' if report.strict else 'after a crash'}) in {report.seconds}s"
            )
        raise SystemExit(0 if report.ok else 1)

    return store
