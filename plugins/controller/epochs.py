"""The epoch file beside the commit log: which epoch wrote which range of the log.

RocketMQ 5's controller mode keeps an ``EpochFile`` for the same reason: after a failover, a
deposed master (or a slave that followed it) must find the last point where its log and the new
master's log still agree, truncate its tail after it, and only then replicate from the new
master.  Each replica records ``epoch -> start offset`` when it starts writing (as master) or
receiving (as slave) data of a new epoch; the end of an epoch is the next one's start, or the log
end for the newest.

The file is text, one entry per line after a version line, and ends with a CRC32 of everything
before it::

    tidemq-epochs 1
    1 0
    2 10240
    crc32 5e0b3a1f

It is replaced atomically (temporary file, fsync, rename, fsync of the directory).  A file that
does not read back exactly (truncated, edited, bad checksum, epochs not increasing) raises
:class:`EpochFileError`: it is never reset silently, because an empty history would make the
replica truncate its whole log or, worse, none of it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import attrs

__all__ = ["EpochEntry", "EpochFile", "EpochFileError", "consistent_point", "epoch_end"]

_VERSION_LINE = "tidemq-epochs 1"


class EpochFileError(Exception):
    """The epoch file is unreadable or inconsistent (the message names the file and the line)."""


@attrs.frozen
class EpochEntry:
    """Epoch ``epoch`` starts at commit-log offset ``start_offset``."""

    epoch: int
    start_offset: int


def epoch_end(entries: Sequence[EpochEntry], index: int, log_end: int) -> int:
    """Where the epoch at ``entries[index]`` ends: the next epoch's start, or ``log_end``."""
    return entries[index + 1].start_offset if index + 1 < len(entries) else log_end


def consistent_point(
    mine: Sequence[EpochEntry], my_end: int, theirs: Sequence[EpochEntry], their_end: int
) -> int | None:
    """The offset up to which two logs hold the same data (the one to truncate to), or None.

    Both sides' entries are walked from the newest epoch down; the first epoch both have, with
    the same start offset, was written by one master, so both logs agree from its start to where
    the shorter of the two stops: ``min(my end of it, their end of it)``.  None: no common epoch;
    the replica must drop its log and copy the master's from the start.
    """
    their_ranges = {e.epoch: (e.start_offset, epoch_end(theirs, i, their_end)) for i, e in enumerate(theirs)}
    for i in range(len(mine) - 1, -1, -1):
        entry = mine[i]
        theirs_range = their_ranges.get(entry.epoch)
        if theirs_range is not None and theirs_range[0] == entry.start_offset:
            return min(epoch_end(mine, i, my_end), theirs_range[1])
    return None


def _check_order(entries: Sequence[EpochEntry], where: str) -> None:
    for before, after in zip(entries, entries[1:], strict=False):
        if after.epoch <= before.epoch or after.start_offset < before.start_offset:
            raise EpochFileError(
                f"{where}: epoch {after.epoch} at offset {after.start_offset} does not follow "
                f"epoch {before.epoch} at offset {before.start_offset}"
            )


class EpochFile:
    """The epochs this replica has seen, persisted at ``path`` (missing file: none yet)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._entries: tuple[EpochEntry, ...] = self._load()

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    @property
    def last(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def _load(self) -> tuple[EpochEntry, ...]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise EpochFileError(f"epoch file {self.path}: {exc.strerror}") from None
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise EpochFileError(f"epoch file {self.path}: not text (corrupt)") from None
        lines = text.split("\n")
        if len(lines) < 3 or lines[-1] != "" or lines[0] != _VERSION_LINE:
            raise EpochFileError(f"epoch file {self.path}: truncated or not an epoch file")
        body, checksum = lines[:-2], lines[-2]
        crc = zlib.crc32(("\n".join(body) + "\n").encode())
        expected = f"crc32 {crc:08x}"
        if checksum != expected:
            raise EpochFileError(f"epoch file {self.path}: checksum mismatch (corrupt or edited)")
        entries = []
        for number, line in enumerate(body[1:], start=2):
            parts = line.split(" ")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise EpochFileError(
                    f"epoch file {self.path} line {number}: expected 'EPOCH OFFSET', got {line!r}"
                )
            entries.append(EpochEntry(int(parts[0]), int(parts[1])))
        _check_order(entries, f"epoch file {self.path}")
        return tuple(entries)

    def _store(self, entries: tuple[EpochEntry, ...]) -> None:
        body = "\n".join([_VERSION_LINE, *(f"{e.epoch} {e.start_offset}" for e in entries)]) + "\n"
        data = body.encode() + f"crc32 {zlib.crc32(body.encode()):08x}\n".encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)
        self._entries = entries

    def record(self, epoch: int, start_offset: int) -> None:
        """Epoch ``epoch`` starts at ``start_offset`` here; durable when this returns.

        Recording the newest entry again is a no-op (a restart re-announcing its epoch); an
        older or equal epoch elsewhere, or an offset before the newest start, is refused.
        """
        last = self.last
        if last is not None and last == EpochEntry(epoch, start_offset):
            return
        if epoch < 1 or start_offset < 0:
            raise ValueError(f"epoch {epoch} at offset {start_offset}: epochs start at 1, offsets at 0")
        if last is not None and (epoch <= last.epoch or start_offset < last.start_offset):
            raise ValueError(
                f"epoch {epoch} at offset {start_offset}: must follow epoch {last.epoch} at offset {last.start_offset}"
            )
        self._store((*self._entries, EpochEntry(epoch, start_offset)))

    def truncate(self, offset: int) -> None:
        """The log was cut at ``offset``: forget the epochs that started at or after it."""
        kept = tuple(e for e in self._entries if e.start_offset < offset)
        if kept != self._entries:
            self._store(kept)

    def end_of(self, epoch: int, log_end: int) -> int | None:
        """Where ``epoch`` ends in this log (None: this replica never saw it)."""
        for i, entry in enumerate(self._entries):
            if entry.epoch == epoch:
                return epoch_end(self._entries, i, log_end)
        return None
