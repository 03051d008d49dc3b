"""POP records: checkpoints, acks and pop offsets (RocketMQ's revive log, ours), and their replay.

The records are written to the commit log's revive topic (:mod:`tidemq.broker.pop.revive_log`),
several per message body.  One line per record (names never hold spaces)::

    C <id> <group> <topic> <queueId> <popTime> <invisibleMs> <reviveQid> <next> <attempt> <o1,o2,...>
    A <id> <hex bitmask of acknowledged positions>
    D <id>                               checkpoint retired (revived, or dropped by FIFO)
    O <group> <topic> <queueId> <next>   a pop offset moved (or, FIFO, went back) without a checkpoint

A queue's pop offset is the last C or O record naming it.

:class:`Journal` is the append-only file ``<data>/pop/journal.log`` these records lived in before
the revive log (not replicated): a broker reads it once at start and moves its state into the
revive log.  A torn last line (no newline) is ignored.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

log = logging.getLogger(__name__)

COMPACT_BYTES = 64 << 20


@attrs.define(slots=True, eq=False)
class Checkpoint:
    """One pop batch of one queue: its messages' offsets and which of them are acknowledged."""

    id: int
    group: str
    topic: str  # the stored topic: the topic itself or a retry topic
    queue_id: int
    pop_time: int
    invisible_ms: int
    revive_qid: int
    next_offset: int  # the queue's pop offset after this batch (-1: made by a change of invisibility)
    attempt: int  # FIFO: deliveries of this batch's messages before this one
    offsets: tuple[int, ...]
    acked: int = 0  # bit i: offsets[i] acknowledged

    @property
    def start(self) -> int:
        return self.offsets[0]

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_ms

    @property
    def full(self) -> int:
        return (1 << len(self.offsets)) - 1

    @property
    def done(self) -> bool:
        return self.acked == self.full

    def unacked(self) -> list[int]:
        return [o for i, o in enumerate(self.offsets) if not self.acked >> i & 1]

    def record(self) -> bytes:
        return (
            f"C {self.id} {self.group} {self.topic} {self.queue_id} {self.pop_time} {self.invisible_ms} "
            f"{self.revive_qid} {self.next_offset} {self.attempt} {','.join(map(str, self.offsets))}\n"
        ).encode()


def ack_record(ck_id: int, bits: int) -> bytes:
    return f"A {ck_id} {bits:x}\n".encode()


def done_record(ck_id: int) -> bytes:
    return f"D {ck_id}\n".encode()


def offset_record(group: str, topic: str, queue_id: int, next_offset: int) -> bytes:
    return f"O {group} {topic} {queue_id} {next_offset}\n".encode()


@attrs.define
class Replayed:
    """What the journal holds: open checkpoints (ack bits applied) and pop offsets."""

    checkpoints: dict[int, Checkpoint] = attrs.field(factory=dict)
    offsets: dict[tuple[str, str, int], int] = attrs.field(factory=dict)
    last_id: int = 0
    skipped: int = 0

    def prune(self) -> None:
        """Forget checkpoints whose every message is acknowledged (retired at replay)."""
        for ck_id in [i for i, ck in self.checkpoints.items() if ck.done]:
            del self.checkpoints[ck_id]


def apply_records(out: Replayed, data: bytes) -> None:
    """Apply newline-terminated records to ``out``; an unreadable one is counted and skipped."""
    for line in data.splitlines():
        try:
            _apply(out, line.decode().split(" "))
        except (ValueError, IndexError, UnicodeDecodeError):
            out.skipped += 1


class Journal:
    """The append-only file; :meth:`replay` once, then :meth:`append`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.size = 0
        self.unsynced = False

    def replay(self) -> Replayed:
        """:meth:`read`, then open the file for appends (a torn last record cut)."""
        out, end = self._read()
        self._open(truncate_to=end)
        return out

    def read(self) -> Replayed:
        """The state the file holds (it is not opened for appends)."""
        return self._read()[0]

    def _read(self) -> tuple[Replayed, int]:
        out = Replayed()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("pop journal %s: torn last record (%d bytes) ignored", self.path, len(data) - end)
        apply_records(out, data[:end])
        if out.skipped:
            log.warning("pop journal %s: %d unreadable records skipped", self.path, out.skipped)
        out.prune()
        return out, end

    def _open(self, truncate_to: int | None = None) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if truncate_to is not None:
            os.ftruncate(fd, truncate_to)
        self._fd = fd
        self.size = os.fstat(fd).st_size

    def append(self, data: bytes) -> None:
        """One write: on disk for the OS once this returns (SIGKILL-safe, not power-loss-safe)."""
        os.write(self._fd, data)
        self.size += len(data)
        self.unsynced = True

    def sync(self) -> None:
        if self.unsynced and self._fd >= 0:
            self.unsynced = False
            os.fsync(self._fd)

    def rewrite(self, records: Iterable[bytes]) -> None:
        """Replace the file by ``records`` (the live state), atomically."""
        tmp = self.path.with_suffix(".compact")
        with open(tmp, "wb") as f:
            for rec in records:
                f.write(rec)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        old = self._fd
        self._open()
        os.close(old)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1


def _apply(out: Replayed, f: list[str]) -> None:
    kind = f[0]
    if kind == "C":
        offsets = tuple(int(o) for o in f[10].split(","))
        if not offsets:
            raise ValueError("empty checkpoint")
        ck = Checkpoint(
            int(f[1]), f[2], f[3], int(f[4]), int(f[5]), int(f[6]), int(f[7]), int(f[8]), int(f[9]), offsets
        )
        out.checkpoints[ck.id] = ck
        out.last_id = max(out.last_id, ck.id)
        if ck.next_offset >= 0:  # -1: a change of invisibility, no pop
            out.offsets[(ck.group, ck.topic, ck.queue_id)] = ck.next_offset
    elif kind == "A":
        acked = out.checkpoints.get(int(f[1]))
        if acked is not None:
            acked.acked |= int(f[2], 16) & acked.full
    elif kind == "D":
        out.checkpoints.pop(int(f[1]), None)
    elif kind == "O":
        out.offsets[(f[1], f[2], int(f[3]))] = int(f[4])
    else:
        raise ValueError(kind)


def live_records(
    offsets: dict[tuple[str, str, int], int], checkpoints: Iterable[Checkpoint]
) -> Iterator[bytes]:
    for ck in checkpoints:
        yield ck.record()
        if ck.acked:
            yield ack_record(ck.id, ck.acked)
    for (group, topic, qid), nxt in offsets.items():  # after: a checkpoint's record sets the offset too
        yield offset_record(group, topic, qid, nxt)
