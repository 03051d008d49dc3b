"""The exactly-once sink's commit log, kept in the query's checkpoint, and the check-back rule.

Each streaming micro-batch the exactly-once sink writes is a set of RocketMQ half messages, sent
by write tasks that each tag their messages with a fresh *token*
(``tidemqSparkTxn = <query key>/<batch id>/<token>``).  When the driver commits batch ``N`` it
first records, once and for all, which tokens make up batch ``N`` (``<log>/<N>.json``, written to
a temporary name, fsynced and renamed), and only then ends the half messages with COMMIT.  The
record is the decision: a broker's check-back for any half message is answered from it
(:func:`decide`), so a driver that dies at any point (before the record: nothing of that attempt
is ever delivered; after it: the recorded attempt is delivered, by the driver or by the
check-back) leaves every row delivered exactly once after the query restarts from its checkpoint.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import attrs

from .options import TidemqSparkError

log = logging.getLogger(__name__)

#: Property every exactly-once half message carries: ``<query key>/<batch id>/<token>``.
TXN_PROPERTY = "tidemqSparkTxn"
#: Records kept behind the newest (Spark's ``spark.sql.streaming.minBatchesToRetain`` default).
RETAIN = 100
_RECORD = re.compile(r"^(\d+)\.json$")


class Decision(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


@attrs.frozen
class TxnTag:
    """What ``tidemqSparkTxn`` says: which query, micro-batch and write attempt sent the message."""

    query: str
    batch: int
    token: str

    def render(self) -> str:
        return f"{self.query}/{self.batch}/{self.token}"

    @classmethod
    def parse(cls, value: str | None) -> TxnTag | None:
        parts = (value or "").split("/")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
            return None
        return cls(parts[0], int(parts[1]), parts[2])


def query_key(checkpoint: str) -> str:
    """A short stable name for a streaming query: a digest of its checkpoint location."""
    return hashlib.blake2b(checkpoint.rstrip("/").encode(), digest_size=8).hexdigest()


def local_path(location: str) -> Path:
    """A checkpoint/log location as a local path (``file:`` URIs allowed); other schemes are refused."""
    loc = location.strip()
    if loc.startswith("file://"):
        loc = loc[len("file://") :]
    elif loc.startswith("file:"):
        loc = loc[len("file:") :]
    elif re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", loc):
        raise TidemqSparkError(
            f"the exactly-once sink keeps its commit log on a local or mounted file system; {location!r} is "
            "not one: set option 'transactionLog' to a shared POSIX path (NFS, a mounted volume)"
        )
    return Path(loc)


@attrs.frozen
class BatchRecord:
    """The decision for one micro-batch: the write attempts (tokens) whose messages are delivered."""

    batch: int
    tokens: frozenset[str]
    messages: int


class SinkTransactionLog:
    """``<dir>/<batch id>.json`` records, one per committed micro-batch; created on first use."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def _path(self, batch: int) -> Path:
        return self.dir / f"{batch}.json"

    def get(self, batch: int) -> BatchRecord | None:
        try:
            data = json.loads(self._path(batch).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise TidemqSparkError(
                f"exactly-once sink: unreadable commit record {self._path(batch)}: {exc}"
            ) from None
        return BatchRecord(int(data["batch"]), frozenset(data["tokens"]), int(data.get("messages", 0)))

    def batches(self) -> list[int]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _RECORD.match(n)))

    def latest(self) -> int | None:
        found = self.batches()
        return found[-1] if found else None

    def record(self, rec: BatchRecord) -> BatchRecord:
        """Write ``rec`` unless batch ``rec.batch`` already has a record; the record that stands."""
        existing = self.get(rec.batch)
        if existing is not None:
            return existing
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{rec.batch}.json.{os.getpid()}.tmp"
        body = json.dumps({"batch": rec.batch, "tokens": sorted(rec.tokens), "messages": rec.messages})
        with open(tmp, "wb") as f:
            f.write(body.encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            # link() fails when the name exists: two drivers racing for one batch keep the first record.
            os.link(tmp, self._path(rec.batch))
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the record must survive a crash once END_TRANSACTION may have been sent
        finally:
            os.close(fd)
        stands = self.get(rec.batch)
        assert stands is not None
        self._trim(rec.batch)
        return stands

    def _trim(self, newest: int) -> None:
        for batch in self.batches():
            if batch < newest - RETAIN:
                self._path(batch).unlink(missing_ok=True)


def decide(tag: TxnTag | None, query: str, txlog: SinkTransactionLog) -> Decision:
    """The answer to a broker's check-back for a half message tagged ``tag``.

    * another query's message (or no tag): UNKNOWN, that query's checker answers it;
    * its batch has a record: COMMIT when the record names its token, else ROLLBACK (a failed
      task attempt, or an attempt of a driver that died before this batch was recorded);
    * no record, but a later batch has one: ROLLBACK (the query went past this batch; batches
      commit in order, so it can never be recorded);
    * no record yet: UNKNOWN (the batch is being written, or will be re-run after a restart).
    """
    if tag is None or tag.query != query:
        return Decision.UNKNOWN
    rec = txlog.get(tag.batch)
    if rec is not None:
        return Decision.COMMIT if tag.token in rec.tokens else Decision.ROLLBACK
    latest = txlog.latest()
    if latest is not None and latest > tag.batch:
        return Decision.ROLLBACK
    return Decision.UNKNOWN
