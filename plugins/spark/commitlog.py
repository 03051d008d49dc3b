"""Reading a broker's CommitLog files directly (no broker): the ``tidemq-store`` source's engine.

A store directory holds ``commitlog/<20-digit start offset>`` files of RocketMQ 4.x records
(:mod:`tidemq.message`).  A file's records end at a BLANK record (the end-of-file filler) or at
a zero TOTALSIZE (the preallocated, never written tail).  Records the broker never dispatches to
a ConsumeQueue (prepared or rolled-back transactional messages) are left out, so what this reader
yields for a topic is what consumers of that topic can pull.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from tidemq.errors import CorruptDataError
from tidemq.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    body_crc,
    decode_message,
)

from .options import TidemqSparkError
from .schema import MODE_STORE, NEEDS_REFERENCE, BatchBuilder

log = logging.getLogger(__name__)

_HEAD = struct.Struct(">iI")
_NAME_DIGITS = 20


class CorruptRecordError(TidemqSparkError):
    """A CommitLog record failed validation; the message names the file and offset."""


@attrs.frozen
class CommitLogFile:
    """One CommitLog file: its path and the commit-log offset of its first byte."""

    path: str
    base_offset: int
    size: int


def commitlog_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it holds CommitLog files, else ``path/commitlog``."""
    p = Path(path)
    if not p.is_dir():
        raise TidemqSparkError(f"store path {str(p)!r} is not a directory")
    if (p / "commitlog").is_dir():
        return p / "commitlog"
    if any(_is_commitlog_name(f.name) for f in p.iterdir()):
        return p
    raise TidemqSparkError(f"{str(p)!r} has no commitlog/ directory and no CommitLog files")


def _is_commitlog_name(name: str) -> bool:
    return len(name) == _NAME_DIGITS and name.isdigit()


def list_files(path: str | os.PathLike[str]) -> list[CommitLogFile]:
    """The CommitLog files under a store directory, in offset order."""
    d = commitlog_dir(path)
    out = [
        CommitLogFile(str(f), int(f.name), f.stat().st_size)
        for f in d.iterdir()
        if _is_commitlog_name(f.name) and f.is_file()
    ]
    return sorted(out, key=lambda f: f.base_offset)


def iter_file(
    file: CommitLogFile, *, check_crc: bool = False, skip_corrupt: bool = False
) -> Iterator[MessageExt]:
    """Decode every consumable record of one CommitLog file.

    A corrupt record raises :class:`CorruptRecordError` naming the file and offset; with
    ``skip_corrupt`` it is logged and skipped when its size is plausible, and the rest of the
    file is given up when it is not (no later record boundary can be trusted).
    """
    if file.size == 0:
        return
    with open(file.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            pos = 0
            while pos >= 0:
                msg, pos = _step(view, pos, file, check_crc, skip_corrupt)
                if msg is not None:
                    yield msg
        finally:
            view.release()


def _step(
    view: memoryview, pos: int, file: CommitLogFile, check_crc: bool, skip_corrupt: bool
) -> tuple[MessageExt | None, int]:
    """The record at ``pos``: ``(message or None when skipped, next position or -1 at the end)``."""
    end = len(view)
    if pos + 8 > end:
        return None, -1
    total, magic = _HEAD.unpack_from(view, pos)
    if total == 0:
        return None, -1  # the preallocated tail no record reached
    if magic == BLANK_MAGIC_CODE:
        return None, -1  # end-of-file filler
    where = f"{file.path} at file position {pos} (commit-log offset {file.base_offset + pos})"
    if magic != MESSAGE_MAGIC_CODE or total < 0 or pos + total > end:
        problem = f"bad record header (size {total}, magic {magic:#x})"
        if not skip_corrupt:
            raise CorruptRecordError(f"corrupt CommitLog record in {where}: {problem}")
        log.warning("corrupt CommitLog record in %s: %s; rest of the file skipped", where, problem)
        return None, -1
    problem = ""
    try:
        msg = decode_message(view, pos, check_crc=check_crc)
    except CorruptDataError as exc:
        problem = str(exc)
    if problem:
        # Raised outside the except block: the decoder's frames (holding views of the mapping)
        # must not ride along as __context__, or the mapping cannot be closed.
        if not skip_corrupt:
            raise CorruptRecordError(f"corrupt CommitLog record in {where}: {problem}")
        log.warning("corrupt CommitLog record in %s: %s; skipped", where, problem)
        return None, pos + total
    tx = msg.sys_flag & TRANSACTION_TYPE_MASK
    if tx in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
        return None, pos + total
    return msg, pos + total


def read_batches(
    file: CommitLogFile,
    builder: BatchBuilder,
    *,
    rows: int,
    check_crc: bool = False,
    skip_corrupt: bool = False,
    topics: frozenset[str] | None = None,
) -> Iterator[Any]:
    """The consumable records of one file (of ``topics``) as Arrow record batches of ``rows`` rows.

    One pass over the mapped file: plain records go from the mapping into the column buffers
    (the compiled builder); the others take :func:`_step` and ``BatchBuilder.add``, the reference,
    with :func:`iter_file`'s errors and skips.  Bodies are decompressed; one that does not inflate
    is a corrupt record.
    """
    if file.size == 0:
        return
    topic_keys = tuple(sorted(t.encode() for t in topics)) if topics is not None else None
    crc = body_crc if check_crc else None
    with open(file.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_SEQUENTIAL)  # one pass, front to back: read ahead generously
        view = memoryview(mm)
        try:
            pos = 0
            while pos >= 0:
                pos, code = builder.scan(
                    view, pos, mode=MODE_STORE, topics=topic_keys, max_rows=rows - len(builder), crc=crc
                )
                if code == NEEDS_REFERENCE:
                    msg, pos = _step(view, pos, file, check_crc, skip_corrupt)
                    if msg is not None and (topics is None or msg.topic in topics):
                        _add_stored(builder, msg, file, skip_corrupt)
                elif pos >= len(view):
                    pos = -1
                if len(builder) >= rows or (pos < 0 and len(builder)):
                    yield builder.flush()
        finally:
            view.release()


def _add_stored(builder: BatchBuilder, msg: MessageExt, file: CommitLogFile, skip_corrupt: bool) -> None:
    problem = ""
    try:
        builder.add(msg, decompressed=False)
    except CorruptDataError as exc:
        problem = str(exc)
    if problem:
        where = f"{file.path} (commit-log offset {msg.commit_log_offset})"
        if not skip_corrupt:
            raise CorruptRecordError(f"corrupt CommitLog record in {where}: {problem}")
        log.warning("corrupt CommitLog record in %s: %s; skipped", where, problem)
