"""The ``hash`` key index: RocketMQ's IndexService over a list of :class:`IndexFile`.

Every stored message's ``UNIQ_KEY`` and each ``KEYS`` entry are indexed as ``topic#key`` in the
newest IndexFile under ``<data_dir>/index``; a full file rolls to a new one named by its creation
time (``yyyyMMddHHmmssSSS``).  Queries walk the files newest first and return commit-log offsets
of candidates; :func:`tidemq.index.query_messages` then drops hash collisions.

Durability and recovery.  :meth:`HashIndex.flush` msyncs the files, then writes their headers,
and returns the store timestamp of the last message dispatched before it began: every message
stored up to then is indexed on disk.  The store keeps that value in its checkpoint and after an
abnormal stop calls ``load(False, checkpoint)`` and re-dispatches the messages stored after it.
``load`` then deletes the files begun after the checkpoint (and any file after one whose durable
header is not full), and repairs the file that straddles the checkpoint back to its last flushed
header; RocketMQ deletes that file too, which loses its older keys unless the whole file is
re-dispatched.  Re-dispatched messages at or below the newest kept header's end offset are
skipped, so nothing is indexed twice.

Full disk (or any failure to create or reserve index space).  The put never fails because of the
index: :class:`IndexFile` reserves blocks before writing through its mapping, and when that fails
the index stalls: it logs once, keeps the keys of the messages that arrive meanwhile in a bounded
backlog (hashes and offsets only) and retries every 0.5 s (on dispatch and on flush), indexing the
backlog in commit-log order once space returns.  The checkpoint time it reports stays before the
first unindexed message, so an abnormal stop re-dispatches them.  When the backlog overflows the
index stops at that offset until a restart: a ``rebuild_from`` marker file (written as soon as the
disk allows) makes the next start re-dispatch from there through the store's recovery.

Damaged files.  A file that cannot be opened (bad header, truncated) is moved aside to
``<name>.damaged`` at load; it and every later file (their order cannot absorb the missing range)
are rebuilt from the commit log: :meth:`HashIndex.rebuild_from` tells the store where to start.

Thread safety: dispatch (the store's thread), query (the broker's threads), flush and
delete_expired (the store's service threads) may run concurrently; one lock guards the file list
and the mappings, and the msync of a flush runs outside it so dispatch is not held up by the disk.
"""

from __future__ import annotations

import collections
import errno
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from tidemq.errors import CorruptDataError, StoreError
from tidemq.index import IndexFileEntry, IndexFileInfo, QueryResult
from tidemq.jsonfile import atomic_write_bytes
from tidemq.message import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from tidemq.store import DispatchRequest
from tidemq_index_hash.indexfile import IndexFile, key_hash, walk_file

log = logging.getLogger(__name__)

_INT32_MAX = 0x7FFFFFFF
_FILE_NAME = re.compile(r"^\d{17}$")
#: Marker written when the index stopped short (backlog overflow): the next load rebuilds.
REBUILD_MARKER = "rebuild_from"
#: Messages kept while the index cannot write; past this it stops until a restart rebuilds it.
MAX_BACKLOG = 100_000
#: How often a stalled index tries to reserve space again (the store re-checks the disk as often).
RETRY_INTERVAL_S = 0.5

# One message waiting to be indexed: commit-log offset, store time, key hashes.
_Pending = tuple[int, int, list[int]]


def _slot_num_ok(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if not 1 <= value <= 500_000_000:
        raise ValueError(f"{attr.name} = {value} must be between 1 and 500000000")


def _index_num_ok(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    # Entry numbers are 4-byte ints and entry 0 is reserved, so at least 2 and at most 2^31-1.
    if not 2 <= value <= _INT32_MAX:
        raise ValueError(f"{attr.name} = {value} must be between 2 and {_INT32_MAX}")


@attrs.define(kw_only=True)
class HashIndexOptions:
    """The ``[index.hash]`` table (RocketMQ's maxHashSlotNum / maxIndexNum)."""

    #: Slots per file (4 bytes each); more slots mean shorter collision chains.
    max_hash_slot_num: int = attrs.field(default=5_000_000, validator=_slot_num_ok)
    #: Entries per file (20 bytes each, entry 0 unused); a full file rolls to a new one.
    max_index_num: int = attrs.field(default=20_000_000, validator=_index_num_ok)


def index_keys(request: DispatchRequest) -> list[str]:
    """The keys RocketMQ indexes for a message: its UNIQ_KEY, then each KEYS entry."""
    keys = [request.uniq_key] if request.uniq_key else []
    if request.keys:
        keys.extend(k for k in request.keys.split(" ") if k)
    return keys


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


class HashIndex:
    """IndexFile-based :class:`tidemq.index.KeyIndex`."""

    def __init__(self, store_path: Path, options: HashIndexOptions | None = None) -> None:
        self.store_path = Path(store_path)
        self.options = options or HashIndexOptions()
        self._files: list[IndexFile] = []
        self._dirty: dict[str, IndexFile] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # taken before _lock; keeps files open during an msync
        self._loaded = False
        self._closed = False
        self._covered_ts = 0  # store time of the last message dispatched
        self._indexed_upto = -1  # commit-log offset of the last message whose keys are all indexed
        self._damaged = False  # an unreadable file was moved aside at load: rebuild after it
        self._backlog: collections.deque[_Pending] = collections.deque()
        self._stopped_at: int | None = None  # backlog overflowed: nothing indexed from here on
        self._marker_written = False
        self._marker_loaded = False  # the last run stopped short; cleared once rebuilt and flushed
        self._retry_at = 0.0

    # ------------------------------------------------------------------ lifecycle
    def load(self, last_exit_ok: bool, checkpoint_timestamp_ms: int) -> None:
        """Open the index files; after an abnormal stop drop or repair what the checkpoint lacks."""
        with self._flush_lock, self._lock:
            if self._loaded:
                raise StoreError("the hash index is already loaded")
            self.store_path.mkdir(parents=True, exist_ok=True)
            marker = self.store_path / REBUILD_MARKER
            if marker.exists():
                log.warning("the hash index stopped short in the last run (%s): rebuilding it", marker)
                self._marker_loaded = self._damaged = True
            damage_seen = False
            for path in sorted(self.store_path.iterdir()):
                if not path.is_file() or not _FILE_NAME.match(path.name):
                    continue
                if damage_seen:
                    # After a damaged file: entries must stay in commit-log order, so the later
                    # files are rebuilt too (derived data, re-dispatched from the commit log).
                    log.warning("deleting index file %s: it follows a damaged one and is rebuilt", path.name)
                    path.unlink()
                    continue
                try:
                    f = IndexFile.open(path)
                except (CorruptDataError, OSError) as exc:
                    # Moved aside for inspection; the store re-dispatches the records after the
                    # last readable file before it (rebuild_from), which rebuilds its range.
                    aside = path.with_name(f"{path.name}.damaged")
                    path.rename(aside)
                    log.error(
                        "index file %s is damaged (%s): moved to %s and rebuilt", path.name, exc, aside.name
                    )
                    self._damaged = damage_seen = True
                    continue
                if not last_exit_ok:
                    # A file after one whose durable header is not full was begun after that
                    # header: its keys are re-dispatched (ties on the checkpoint millisecond).
                    stale = bool(self._files) and not self._files[-1].is_full
                    if stale or f.header.begin_timestamp > checkpoint_timestamp_ms:
                        log.info("deleting index file %s, begun after the checkpoint", f.name)
                        f.destroy()
                        continue
                    if not f.is_full:
                        f.repair()
                self._files.append(f)
            newest = self._files[-1] if self._files else None
            self._covered_ts = max(checkpoint_timestamp_ms, newest.header.end_timestamp if newest else 0)
            if newest is not None and (
                len(self._files) > 1 or not newest.is_empty or newest.header.end_phy_offset
            ):
                self._indexed_upto = newest.header.end_phy_offset
            self._loaded = True
            log.info(
                "hash index loaded %d files from %s (last exit %s)",
                len(self._files),
                self.store_path,
                "ok" if last_exit_ok else "abnormal",
            )

    def shutdown(self) -> None:
        """Flush every file and unmap it."""
        if self._closed or not self._loaded:
            self._closed = True
            return
        self.flush()
        with self._flush_lock, self._lock:
            for f in self._files:
                f.close()
            self._files.clear()
            self._dirty.clear()
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the hash index is shut down")
        if not self._loaded:
            raise StoreError("the hash index is used before load()")

    # ------------------------------------------------------------------ write
    def dispatch(self, request: DispatchRequest) -> None:
        """Index the UNIQ_KEY and KEYS of one stored message (skipping rolled-back ones)."""
        with self._lock:
            self._check_open()
            # A rolled-back message's PREPARED record is indexed already (as RocketMQ).
            rolled_back = (request.sys_flag & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE
            # Offsets up to _indexed_upto come back when the store re-dispatches after a crash.
            if request.commit_log_offset <= self._indexed_upto or rolled_back:
                if not self._stalled and request.store_timestamp > self._covered_ts:
                    self._covered_ts = request.store_timestamp
                return
            topic = request.topic
            pending = (
                request.commit_log_offset,
                request.store_timestamp,
                [key_hash(build_key(topic, key)) for key in index_keys(request)],
            )
            if self._stalled and not self._resume():
                self._hold(pending)
                return
            if not self._index(pending):
                self._hold(pending)

    @property
    def _stalled(self) -> bool:
        return bool(self._backlog) or self._stopped_at is not None

    def _index(self, pending: _Pending) -> bool:
        """Index one message whole; ``False`` (logged once per stall) when space is missing."""
        offset, ts, hashes = pending
        if hashes:
            f = self._files[-1] if self._files else None
            try:
                if f is None or f.is_full:
                    f = self._roll(f)
                # Reserve the message's slots and entries first: indexed whole or not at all.
                f.reserve(hashes)
                for h in hashes:
                    if not f.put_key(h, offset, ts):
                        self._dirty[f.name] = f
                        f = self._roll(f)
                        f.reserve([h])
                        f.put_key(h, offset, ts)
            except OSError as exc:
                self._retry_at = time.monotonic() + RETRY_INTERVAL_S
                if not self._stalled:
                    what = "the disk is full" if exc.errno == errno.ENOSPC else "cannot create an index file"
                    log.error(
                        "hash index: %s in %s (%s); indexing from offset %d waits for space "
                        "(puts are not affected)",
                        what,
                        self.store_path,
                        exc,
                        offset,
                    )
                return False
            self._dirty[f.name] = f
        self._indexed_upto = offset
        if ts > self._covered_ts:
            self._covered_ts = ts
        return True

    def _hold(self, pending: _Pending) -> None:
        """Keep a message the index could not write, or stop indexing when too many wait."""
        if self._stopped_at is not None:
            return
        if len(self._backlog) < MAX_BACKLOG:
            self._backlog.append(pending)
            return
        self._stopped_at = self._backlog[0][0]
        self._backlog.clear()
        log.error(
            "hash index: more than %d messages could not be indexed; indexing stopped at offset %d "
            "until a restart rebuilds the index from the commit log",
            MAX_BACKLOG,
            self._stopped_at,
        )
        self._write_marker()

    def _resume(self) -> bool:
        """Retry the backlog (at most every RETRY_INTERVAL_S); True once it is all indexed."""
        if self._stopped_at is not None:
            if not self._marker_written and time.monotonic() >= self._retry_at:
                self._retry_at = time.monotonic() + RETRY_INTERVAL_S
                self._write_marker()
            return False
        if time.monotonic() < self._retry_at:
            return False
        while self._backlog:
            if not self._index(self._backlog[0]):
                return False
            self._backlog.popleft()
        log.warning("hash index: space is back, indexing resumed at offset %d", self._indexed_upto)
        return True

    def _write_marker(self) -> None:
        try:
            atomic_write_bytes(self.store_path / REBUILD_MARKER, b"%d\n" % (self._indexed_upto + 1))
        except OSError as exc:
            log.debug("cannot write the index rebuild marker yet: %s", exc)
            return
        self._marker_written = True

    def _roll(self, prev: IndexFile | None) -> IndexFile:
        path = self.store_path / self._next_name()
        while path.exists():  # an unreadable file skipped at load may hold the name
            path = self.store_path / f"{int(path.name) + 1:017d}"
        f = IndexFile.create(
            path,
            self.options.max_hash_slot_num,
            self.options.max_index_num,
            prev.header.end_phy_offset if prev else 0,
            prev.header.end_timestamp if prev else 0,
        )
        self._files.append(f)
        if prev is not None:
            log.info("index file %s is full, rolled to %s", prev.name, f.name)
        return f

    def _next_name(self) -> str:
        now = time.time()
        name = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
        # Names sort as creation order; two files in one millisecond (tiny test files) get +1.
        if self._files and name <= self._files[-1].name:
            name = f"{int(self._files[-1].name) + 1:017d}"
        return name

    # ------------------------------------------------------------------ read
    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryResult:
        """Offsets, newest first, of messages whose ``topic#key`` hash matches in the time range."""
        with self._lock:
            self._check_open()
            newest = self._files[-1] if self._files else None
            last_ts = newest.header.end_timestamp if newest else 0
            last_phy = newest.header.end_phy_offset if newest else 0
            if max_num <= 0 or begin_ts > end_ts or not key or not self._files:
                return QueryResult((), last_ts, last_phy)
            h = key_hash(build_key(topic, key))
            out: list[int] = []
            seen: set[int] = set()
            for f in reversed(self._files):
                if f.time_matched(begin_ts, end_ts):
                    f.select_phy_offsets(h, begin_ts, end_ts, max_num, out, seen)
                if f.header.begin_timestamp < begin_ts or len(out) >= max_num:
                    break  # older files hold older messages only
            return QueryResult(tuple(out), last_ts, last_phy)

    # ------------------------------------------------------------------ durability
    def flush(self) -> int:
        """Make every dispatched key durable; returns the store time they cover (the checkpoint)."""
        with self._flush_lock:
            with self._lock:
                if self._closed or not self._loaded:
                    return self._covered_ts
                if self._stalled:
                    self._resume()  # space may have come back while no message arrived
                covered = self._covered_ts
                clear_marker = self._marker_loaded and not self._stalled
                snapshot = [(f, f.header.pack()) for f in self._dirty.values()]
                self._dirty.clear()
            # Entries first, then the header that counts them: a crash in between leaves the old
            # header, which describes only durable entries.
            for f, packed in snapshot:
                f.sync_data()
                f.write_header(packed)
            if clear_marker:
                # The re-dispatch of the load that found the marker is durable now.
                (self.store_path / REBUILD_MARKER).unlink(missing_ok=True)
                self._marker_loaded = False
            return covered

    def delete_expired(self, min_phy_offset: int) -> None:
        """Delete files whose entries all point below the commit log's minimum offset.

        The newest file is kept: it carries the offset and time the next file starts from.
        """
        with self._flush_lock, self._lock:
            if not self._loaded or self._closed:
                return
            while len(self._files) > 1 and self._files[0].header.end_phy_offset < min_phy_offset:
                f = self._files.pop(0)
                self._dirty.pop(f.name, None)
                log.info(
                    "deleting expired index file %s (ends at offset %d)", f.name, f.header.end_phy_offset
                )
                f.destroy()

    def rebuild_from(self) -> int | None:
        """Where the store must re-dispatch from after unreadable files were skipped at load.

        The start of the last record indexed whole (a record boundary the store can scan from;
        dispatch skips that record itself), or 0 when nothing readable is left.
        """
        return max(self._indexed_upto, 0) if self._damaged else None

    def truncate(self, phy_end: int) -> None:
        """Forget entries of records at or past ``phy_end``, the commit log's recovered end.

        Called by the store after recovery: a crash that lost the log's tail would otherwise leave
        keys pointing into offsets that new records reuse, and keep those new records from being
        indexed (dispatch skips offsets up to the last one indexed).
        """
        with self._flush_lock, self._lock:
            if not self._loaded or self._closed:
                return
            dropped = 0
            while self._files and self._files[-1].header.end_phy_offset >= phy_end:
                f = self._files[-1]
                dropped += f.truncate_to(phy_end)
                if f.is_empty and len(self._files) > 1:
                    self._files.pop()
                    self._dirty.pop(f.name, None)
                    f.destroy()
                    continue
                break
            if self._indexed_upto >= phy_end:
                # Whatever is kept now ends before phy_end; records from there on get indexed again.
                kept = [f.header.end_phy_offset for f in self._files if not f.is_empty]
                self._indexed_upto = max(kept, default=-1)
            if dropped:
                log.warning(
                    "hash index: dropped %d entries past the recovered commit-log end %d", dropped, phy_end
                )

    # ------------------------------------------------------------------ verification
    def walk_files(self) -> Iterator[IndexFileInfo | IndexFileEntry]:
        """:class:`tidemq.index.VerifiableIndex`: the files under the index directory, read-only."""
        if not self.store_path.is_dir():
            return
        for path in sorted(p for p in self.store_path.iterdir() if p.is_file() and p.name.isdigit()):
            yield from walk_file(path)

    def entry_matches(self, entry: IndexFileEntry, topic: str, keys: Sequence[str]) -> bool:
        return any(key_hash(build_key(topic, k)) == entry.key_hash for k in keys)

    # ------------------------------------------------------------------ introspection
    def file_names(self) -> list[str]:
        """Names of the open index files, oldest first (admin tools, tests)."""
        with self._lock:
            return [f.name for f in self._files]

    def stats(self) -> dict[str, int]:
        """File count and entries indexed, for monitoring."""
        with self._lock:
            return {
                "files": len(self._files),
                "entries": sum(f.header.index_count - 1 for f in self._files),
                "covered_timestamp": self._covered_ts,
            }
