"""The ``hash`` key index: RocketMQ's IndexService over a list of :class:`IndexFile`.

Every stored message's ``UNIQ_KEY`` and each ``KEYS`` entry are indexed as ``topic#key`` in the
newest IndexFile under ``<data_dir>/index``; a full file rolls to a new one named by its creation
time (``yyyyMMddHHmmssSSS``).  Queries walk the files newest first and return commit-log offsets
of candidates; :func:`tidemq.index.query_messages` then drops hash collisions.

Off the put path (RocketMQ builds the index in its reput service).  The store hands each put to
:meth:`HashIndex.dispatch_batch` (:class:`tidemq.store.BatchDispatcher`) under its lock; that
appends the batch's columns to an in-memory queue and returns, so the put path pays a deque
append per batch and no lock (the store's lock serialises its calls); a store call of several
puts (the mmap store's group put) comes as one :meth:`HashIndex.dispatch_groups`, one
``deque.extend`` of the same entries.  A put whose messages carry
no key at all (POP revive and checkpoint records, most system topics) is not queued: it only
notes its store time, which the checkpoint may cover once everything queued before it is indexed.
The index thread (``hash-index``, started by the first batch) is woken from idle by the first
keyed put, then runs a round every ``ROUND_S`` while puts keep coming (no wake-up per put or per
round: it goes back to sleep after a round that found nothing) and indexes what is queued, in commit-log order, in chunks of
``DRAIN_CHUNK`` messages: the key hashes and the IndexFile entries are computed in compiled code
when it is built (:mod:`tidemq_index_hash.native`).  A chunk of several puts is indexed as one
(:meth:`HashIndex._index_chunk`: one ``hash_chunk`` call and one ``put_batch`` with a store time
per message), and the compiled code releases the GIL for the hashing (the keys are first copied
into a C buffer) and for the slot and entry writes: the event loop runs meanwhile, and the two
threads hand the GIL over about once per chunk rather than once per put.  A query by key, ``flush``, ``truncate``,
``rebuild_from``, ``stats`` and ``file_names`` first index whatever is still queued, under the
index lock: a key is found as soon as the put that stored it is acknowledged (it was queued
before the put returned), whatever the index thread's lag.  The queue is bounded: past
``MAX_QUEUED`` messages a put indexes a chunk itself before returning (back-pressure instead of
memory growing without limit).  Under a steady load the index thread is mostly idle: once
``inline_keys`` messages (256) are queued, the put that finds the index lock free indexes the
whole queue itself, as one chunk, on its own thread (the event loop's), and the index thread
keeps a slow pace (a round per ``INLINE_ROUNDS`` x ``ROUND_S``) for what is left when puts stop:
it leaves a round to the puts while the oldest queued put is younger than that pace (they are
still coming and will index the queue themselves).
Measured on single sends: the thread's wake-ups and GIL hand-overs per round cost more of the
broker's CPU than the indexing itself (``docs/request-lanes.md``, single's section).
:meth:`HashIndex.dispatch` (one request) indexes synchronously,
after what is queued.  An abnormal stop loses the queue: the checkpoint never covers it (below).

Durability and recovery.  :meth:`HashIndex.flush` indexes what is queued, msyncs the files, then
writes their headers, and returns the store timestamp of the last message dispatched before it
began: every message stored up to then is indexed on disk.  The store keeps that value in its
checkpoint and after an abnormal stop calls ``load(False, checkpoint)`` and re-dispatches the
messages stored after it.  ``load`` then deletes the files begun after the checkpoint (and any
file after one whose durable header is not full), and repairs the file that straddles the
checkpoint back to its last flushed header; RocketMQ deletes that file too, which loses its older
keys unless the whole file is re-dispatched.  Re-dispatched messages at or below the newest kept
header's end offset are skipped, so nothing is indexed twice.

Full disk (or any failure to create or reserve index space).  The put never fails because of the
index: :class:`IndexFile` reserves blocks before writing through its mapping, and when that fails
the index stalls: it logs once, keeps the keys of the messages that arrive meanwhile in a bounded
backlog (hashes and offsets only) and retries every 0.5 s (as batches come and on flush), indexing the
backlog in commit-log order once space returns.  The checkpoint time it reports stays before the
first unindexed message, so an abnormal stop re-dispatches them.  When the backlog overflows the
index stops at that offset until a restart: a ``rebuild_from`` marker file (written as soon as the
disk allows) makes the next start re-dispatch from there through the store's recovery.

Damaged files.  A file that cannot be opened (bad header, truncated) is moved aside to
``<name>.damaged`` at load; it and every later file (their order cannot absorb the missing range)
are rebuilt from the commit log: :meth:`HashIndex.rebuild_from` tells the store where to start.

Thread safety: dispatch_batch (the store's thread, under its lock), the index thread, query (the
broker's threads), flush and delete_expired (the store's service threads) may run concurrently.
The queue is a deque (atomic appends and pops); the index lock guards the file list and the
mappings, and only its holder takes batches off the queue, so they are indexed in order.  The
compiled insertion writes through the mapping without the GIL but with the index lock held (and the
mapping's buffer exported, so it cannot be closed meanwhile); a query reads under the same lock.  The msync of a flush runs
outside it so indexing is not held up by the disk.  Nothing holding the index lock waits for the
store's lock, so a put that drains (back-pressure) cannot deadlock.
"""

from __future__ import annotations

import array
import collections
import errno
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from tidemq.errors import CorruptDataError, StoreError
from tidemq.index import IndexFileEntry, IndexFileInfo, QueryResult
from tidemq.jsonfile import atomic_write_bytes
from tidemq.message import Prop
from tidemq.store import DispatchedPut, DispatchRequest
from tidemq.threads import name_this_thread
from tidemq_index_hash import native
from tidemq_index_hash.indexfile import IndexFile, hash_batch, hash_chunk, key_hash, put_batch, walk_file

log = logging.getLogger(__name__)

_INT32_MAX = 0x7FFFFFFF
_FILE_NAME = re.compile(r"^\d{17}$")
#: Marker written when the index stopped short (backlog overflow): the next load rebuilds.
REBUILD_MARKER = "rebuild_from"
#: Messages kept while the index cannot write; past this it stops until a restart rebuilds it.
MAX_BACKLOG = 100_000
#: How often a stalled index tries to reserve space again (the store re-checks the disk as often).
RETRY_INTERVAL_S = 0.5
#: Messages queued for the index thread before a put indexes a chunk itself (back-pressure).
MAX_QUEUED = 16_384
#: Messages the index thread indexes per hold of the index lock (a query waits at most that).
DRAIN_CHUNK = 4_096
#: The index thread's pace: at most one round of indexing per ROUND_S, so under load one wake-up
#: serves many puts (a query never waits for it: it indexes what is queued itself).
ROUND_S = 0.005
#: The index thread's pace when puts index the queue themselves (``inline_keys``): a round per
#: this many ROUND_S (50 ms); it indexes only what they left when they stopped.
INLINE_ROUNDS = 10
#: Keys from which the index thread's compiled calls release the GIL (the compiled module's own
#: default, NOGIL_MIN): below it the work is shorter than a hand-over to the event loop and back.
THREAD_GIL_RELEASE_KEYS = 64
_UNIQ = Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_KEYS = Prop.KEYS

# One message waiting to be indexed (the full-disk backlog): commit-log offset, store time, key hashes.
_Pending = tuple[int, int, list[int]]
# One put waiting for the index thread: topic, property mappings, commit-log offsets, store time,
# sys flags, and when it was queued (time.monotonic(), for the lag figures).
_Queued = tuple[str, Sequence[Mapping[str, str]], Sequence[int], int, Sequence[int], float]


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
    #: Keys queued before a put indexes them itself, on the thread that puts (the event loop's),
    #: in one chunk, instead of leaving them to the index thread (0: never).  The index thread
    #: then keeps a slow pace (``INLINE_ROUNDS``) for what is left when puts stop, and the
    #: compiled hashing and insertion keep the GIL (with 0 they release it from 64 keys on).
    inline_keys: int = attrs.field(default=256, validator=attrs.validators.ge(0))


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


class HashIndex:
    """IndexFile-based :class:`tidemq.index.KeyIndex` and :class:`tidemq.store.BatchDispatcher`."""

    def __init__(self, store_path: Path, options: HashIndexOptions | None = None) -> None:
        self.store_path = Path(store_path)
        self.options = options or HashIndexOptions()
        # Keys from which this index's compiled calls release the GIL, passed with each call
        # (never a setting of the module, which another index or thread would see).  Indexing
        # inline, they keep it: releasing it only hands it to another thread and back (measured:
        # 1.18x the sends per server CPU-second).  The index thread's rounds: _release_gil.
        self._gil_keys = 0 if self.options.inline_keys else THREAD_GIL_RELEASE_KEYS
        self._files: list[IndexFile] = []
        # Files written since the last flush, in the order they were written (an ordered set).
        self._dirty: dict[IndexFile, None] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # taken before _lock; keeps files open during an msync
        self._loaded = False
        self._closed = False
        self._covered_ts = 0  # store time of the last message indexed (or skipped)
        self._indexed_upto = -1  # commit-log offset of the last message whose keys are all indexed
        self._damaged = False  # an unreadable file was moved aside at load: rebuild after it
        self._backlog: collections.deque[_Pending] = collections.deque()
        self._stopped_at: int | None = None  # backlog overflowed: nothing indexed from here on
        self._marker_written = False
        self._marker_loaded = False  # the last run stopped short; cleared once rebuilt and flushed
        self._retry_at = 0.0
        # The queue of the put path (dispatch_batch) and the index thread that empties it.
        # dispatch_batch appends (its calls never overlap: the store's lock) and only the holder
        # of the index lock pops; deque appends and pops are atomic, so the put path takes no lock.
        self._queue: collections.deque[_Queued] = collections.deque()
        self._enqueued = 0  # messages ever queued (written by dispatch_batch only)
        self._dequeued = 0  # messages ever taken off the queue (index lock held)
        self._wake = threading.Event()  # set by a put that finds the index thread idle
        #: The newest put with no key (store time, messages queued before it): not queued, covered
        #: by the checkpoint once those are indexed.  One tuple, replaced whole (read without a lock).
        self._keyless: tuple[int, int] = (0, 0)
        self._worker_lock = threading.Lock()  # guards _worker and _stopping
        self._halt = threading.Event()  # set by shutdown: the index thread ends
        self._worker: threading.Thread | None = None
        self._stopping = False
        self._lag_max_s = 0.0  # the oldest queued put's age when indexing began, at most
        self._put_drains = 0  # puts that indexed a chunk themselves (back-pressure)
        self._inline_drains = 0  # puts that indexed the queue themselves (inline_keys)
        self._wakeups = 0  # puts that woke the index thread from idle
        self._thread_rounds = 0  # rounds of the index thread that indexed (not left to the puts)
        self._keyless_puts = 0  # puts with no key: not queued

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
                "hash index loaded %d files from %s (last exit %s; key hashing and insertion: %s)",
                len(self._files),
                self.store_path,
                "ok" if last_exit_ok else "abnormal",
                native.DESCRIPTION,
            )

    def shutdown(self) -> None:
        """Stop the index thread, index what is queued, flush every file and unmap it."""
        self._stop_worker()
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

    # ------------------------------------------------------------------ the put path
    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Sequence[Mapping[str, str]],
        commit_log_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Sequence[int],
    ) -> None:
        """:class:`tidemq.store.BatchDispatcher`: queue a put's keys for the index thread.

        Runs under the store's lock: an append to a deque, nothing per message, no lock (the
        store's serialises these calls).  Past ``MAX_QUEUED`` waiting messages it indexes a chunk
        itself first (back-pressure).
        """
        if self._closed or not self._loaded:
            self._check_open()
        n = len(commit_log_offsets)
        if not n:
            return
        for props in properties:
            if _UNIQ in props or _KEYS in props:
                break
        else:  # nothing to index: no queue entry, no wake-up
            self._keyless = (store_timestamp, self._enqueued)
            self._keyless_puts += 1
            return
        self._queue.append(
            (topic, properties, commit_log_offsets, store_timestamp, sys_flags, time.monotonic())
        )
        self._enqueued += n
        self._after_queued()

    def dispatch_groups(self, puts: Sequence[DispatchedPut]) -> None:
        """:class:`tidemq.store.GroupDispatcher`: a store call's puts, as :meth:`dispatch_batch`
        for each in order would leave the index (the same queue entries, the same keyless mark),
        with one append to the queue, one look at the index thread and at the queue's bound for
        the call (issue 38, groupdispatch: ~27 single sends over 8 queues are one call)."""
        if self._closed or not self._loaded:
            self._check_open()
        entries: list[_Queued] = []
        taken = 0
        now = time.monotonic()
        for topic, _queue_id, properties, offsets, _sizes, _tags, ts, _queue_offset, sys_flags in puts:
            n = len(offsets)
            if not n:
                continue
            for props in properties:
                if _UNIQ in props or _KEYS in props:
                    break
            else:  # nothing to index: no queue entry
                self._keyless = (ts, self._enqueued + taken)
                self._keyless_puts += 1
                continue
            entries.append((topic, properties, offsets, ts, sys_flags, now))
            taken += n
        if entries:
            self._queue.extend(entries)
            self._enqueued += taken
            self._after_queued()

    def _after_queued(self) -> None:
        """After puts were queued: an inline drain, the index thread's wake-up, the back-pressure."""
        inline = self.options.inline_keys
        if inline and self._enqueued - self._dequeued >= inline and self._lock.acquire(blocking=False):
            try:  # the index lock free: no indexing under way, this thread indexes the queue
                if not self._closed:
                    self._inline_drains += 1
                    self._drain()
            except Exception:  # a bug: the put stands, the index thread retries what is queued
                log.exception("hash index: a put's indexing failed; left to the index thread")
            finally:
                self._lock.release()
        if not self._wake.is_set():  # after the append: the thread's clear looks at the queue again
            if self._worker is None:
                self._start_worker()
            self._wakeups += 1
            self._wake.set()
        if self._enqueued - self._dequeued > MAX_QUEUED:
            with self._lock:
                if not self._closed:
                    self._put_drains += 1
                    self._drain(DRAIN_CHUNK)

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._worker is None and not self._stopping:
                self._worker = threading.Thread(target=self._run, name="hash-index", daemon=True)
                self._worker.start()

    def dispatch(self, request: DispatchRequest) -> None:
        """Index the UNIQ_KEY and KEYS of one stored message now, after what is queued.

        The per-request :class:`tidemq.index.KeyIndex` contract (tools, tests, stores that do
        not batch); rolled-back transaction halves are skipped (their PREPARED record is indexed).
        """
        props: dict[str, str] = {}
        if request.uniq_key:
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = request.uniq_key
        if request.keys:
            props[Prop.KEYS] = request.keys
        with self._lock:
            self._check_open()
            self._drain()
            self._index_batch(
                request.topic,
                (props,),
                (request.commit_log_offset,),
                request.store_timestamp,
                (request.sys_flag,),
            )

    def pending(self) -> tuple[int, float]:
        """Messages waiting for the index thread, and the age (s) of the oldest (the lag)."""
        try:
            oldest = self._queue[0][5]
        except IndexError:
            return 0, 0.0
        return self._enqueued - self._dequeued, time.monotonic() - oldest

    # ------------------------------------------------------------------ the index thread
    def _run(self) -> None:
        name_this_thread()
        # The first round keeps the pace too: 0.0 here let it run at once whenever the machine's
        # monotonic clock (its uptime) was past ROUND_S, so the pace depended on the uptime.
        # The wake event stays set while puts keep coming: a round every ROUND_S, no wake-up per
        # put; it is cleared after a round that found nothing (the queue is looked at again after
        # the clear: a put that saw it still set did not set it).
        last_round = time.monotonic()
        while True:
            self._wake.wait()
            inline = self.options.inline_keys
            pace = ROUND_S * INLINE_ROUNDS if inline else ROUND_S
            pause = last_round + pace - time.monotonic()
            if pause > 0 and self._halt.wait(pause):
                return  # shutdown() indexes the rest
            if inline and self._puts_index_it(pace):
                last_round = time.monotonic()
                continue
            self._thread_rounds += 1
            before = self._dequeued
            more = True
            while more and not self._stopping:
                with self._lock:
                    if self._closed:
                        return
                    # Here, off the event loop, the compiled hashing and insertion release the GIL
                    # even when puts index inline (which keep it): the loop serves requests
                    # meanwhile instead of waiting out the chunk (issue 38: at 2 000 sends/s this
                    # thread indexed ~18 chunks a second, each holding the GIL ~0.1-0.4 ms).
                    gil_keys = self._release_gil()
                    try:
                        more = self._drain(DRAIN_CHUNK, gil_keys)
                    except Exception:  # a bug: readers and puts still index what is queued
                        log.exception("hash index: the index thread failed; retrying next round")
                        more = False
            last_round = time.monotonic()
            if self._stopping:
                return  # shutdown() indexes the rest
            if self._dequeued == before and not self._queue:  # idle (readers may have drained)
                self._wake.clear()
                if self._queue:
                    self._wake.set()

    def _puts_index_it(self, pace: float) -> bool:
        """Whether this round can be left to the puts (``inline_keys``): the oldest queued put
        is younger than a ``pace``, so puts are still coming.  Under a load the queue reaches
        ``inline_keys`` within a pace and the put that finds it there indexes it (a round would
        take the GIL from the event loop for a part of the queue the puts index anyway); a slower
        trickle is this thread's at its next round, the oldest put then older than a pace.  So a
        queued put waits at most two paces (100 ms) for the index; a query never waits (it
        indexes the queue itself first).
        """
        try:
            oldest = self._queue[0][5]
        except IndexError:
            return False  # nothing queued: the round only covers the keyless puts
        return time.monotonic() - oldest < pace

    def _release_gil(self) -> int | None:
        """Keys from which the index thread's compiled calls release the GIL
        (``THREAD_GIL_RELEASE_KEYS``), passed with each of its round's calls; None: as this
        index's other calls (``bench/index_gil_hold.py`` swaps it to compare the two).

        An argument of the calls, not a setting of the compiled module: a round of this index
        changes nothing another index (or a put on the loop) sees.
        """
        return THREAD_GIL_RELEASE_KEYS

    def _stop_worker(self) -> None:
        with self._worker_lock:
            self._stopping = True
            worker = self._worker
        self._halt.set()
        self._wake.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=30)

    def _drain(self, limit: int | None = None, gil_keys: int | None = None) -> bool:
        """Index queued puts, oldest first (the index lock held); True when more are queued.

        ``limit`` bounds the messages taken (at least one put); ``None`` takes all that are queued
        when it is called (a query, a flush: what was acknowledged before them).  ``gil_keys``:
        keys from which the compiled calls release the GIL (None: this index's own figure).
        """
        gil = self._gil_keys if gil_keys is None else gil_keys
        queue = self._queue
        items: list[_Queued] = []
        taken = 0
        count = len(queue) if limit is None else -1  # the puts acknowledged before a reader came
        while queue and (taken < limit if limit is not None else len(items) < count):
            item = queue.popleft()
            items.append(item)
            taken += len(item[2])
        self._dequeued += taken
        if not items:
            self._cover_keyless()
            return False
        lag = time.monotonic() - items[0][5]
        if lag > self._lag_max_s:
            self._lag_max_s = lag
        if len(items) > 1 and self._index_chunk(items, gil):
            items = []
        for topic, properties, offsets, ts, sys_flags, _queued_at in items:
            try:
                self._index_batch(topic, properties, offsets, ts, sys_flags, gil)
            except Exception:
                # A bug or input no put should carry (a store refuses properties it cannot
                # encode): this put's keys are lost, the index goes on with the next.
                log.exception(
                    "hash index: cannot index %d messages of %s at offset %d", len(offsets), topic, offsets[0]
                )
        self._cover_keyless()
        return bool(queue)

    def _cover_keyless(self) -> None:
        """The newest keyless put is covered once every put queued before it is indexed."""
        ts, after = self._keyless
        if self._dequeued >= after and ts > self._covered_ts and not self._stalled:
            self._covered_ts = ts

    # ------------------------------------------------------------------ indexing (index lock held)
    @property
    def _stalled(self) -> bool:
        return bool(self._backlog) or self._stopped_at is not None

    def _index_chunk(self, items: Sequence[_Queued], gil: int) -> bool:
        """Index several queued puts at once, in order: one hashing of all their keys and one
        insertion (each releases the GIL for the whole chunk: the event loop runs meanwhile, and
        hands the GIL back once per chunk, not per put).  False when it could not hash them (a
        put the reference refuses): nothing was written, the caller indexes put by put.
        """
        upto = self._indexed_upto
        batches = []
        offsets: list[int] = []
        tss: list[int] = []
        for topic, properties, offs, ts, sys_flags, _queued_at in items:
            skip = 0
            if offs[0] <= upto:  # re-dispatched after a crash (see _index_batch)
                n = len(offs)
                while skip < n and offs[skip] <= upto:
                    skip += 1
            batches.append((topic, properties, sys_flags, skip))
            # What _index_batch would have made _indexed_upto (a rolled-back last message aside:
            # skipped either way), for a re-dispatch later in the chunk.
            last = offs[-1]
            if last > upto:
                upto = last
            offsets += offs
            tss += [ts] * len(offs)
        try:
            hashes, counts = hash_chunk(batches, gil)
        except Exception:
            return False
        if len(counts) != len(offsets):
            return False
        if (self._backlog or self._stopped_at is not None) and not self._resume(gil):
            self._hold_from(hashes, counts, offsets, tss, 0, 0)
            return True
        msg, hpos, failure = self._put(hashes, counts, offsets, tss, gil)
        if failure is not None:
            self._failed(failure, offsets[msg])
            self._hold_from(hashes, counts, offsets, tss, msg, hpos)
        return True

    def _index_batch(
        self,
        topic: str,
        properties: Sequence[Mapping[str, str]],
        offsets: Sequence[int],
        ts: int,
        sys_flags: Sequence[int],
        gil_keys: int | None = None,
    ) -> None:
        """Index one put's messages whole, in order (skipping rolled-back ones)."""
        gil = self._gil_keys if gil_keys is None else gil_keys
        skip = 0
        upto = self._indexed_upto
        if offsets[0] <= upto:
            # Offsets up to _indexed_upto come back when the store re-dispatches after a crash.
            n = len(offsets)
            while skip < n and offsets[skip] <= upto:
                skip += 1
            if skip == n:
                if not self._stalled and ts > self._covered_ts:
                    self._covered_ts = ts
                return
        hashes, counts = hash_batch(topic, properties, sys_flags, skip, gil)
        if (self._backlog or self._stopped_at is not None) and not self._resume(gil):
            self._hold_from(hashes, counts, offsets, ts, 0, 0)
            return
        msg, hpos, failure = self._put(hashes, counts, offsets, ts, gil)
        if failure is not None:
            self._failed(failure, offsets[msg])
            self._hold_from(hashes, counts, offsets, ts, msg, hpos)

    def _put(
        self,
        hashes: array.array[int],
        counts: array.array[int],
        offsets: Sequence[int],
        ts: int | Sequence[int],
        gil: int,
    ) -> tuple[int, int, OSError | None]:
        """Write the entries of messages in order, rolling to new files as they fill.

        Returns where it stopped ``(msg, hpos, None)`` with ``msg == len(counts)``, or the error
        that stopped it at message ``msg`` (nothing of it from hash ``hpos`` on written).
        """
        n = len(counts)
        msg = hpos = 0
        f = self._files[-1] if self._files else None
        failure: OSError | None = None
        while True:
            if f is not None:
                before = f.header.index_count
                msg, hpos, err = put_batch(f, hashes, counts, offsets, ts, msg, hpos, gil)
                if f.header.index_count != before:
                    self._dirty[f] = None
                if msg >= n:
                    break
                if err:
                    failure = OSError(err, os.strerror(err))
                    break
                self._dirty[f] = None  # full: its header is flushed, then a new file
            elif hpos >= len(hashes):
                msg = n  # no file yet, and no key left to write
                break
            try:
                f = self._roll(f)
            except OSError as exc:
                failure = exc
                break
        if msg:
            last = msg - 1
            while last >= 0 and counts[last] < 0:
                last -= 1
            if last >= 0:
                self._indexed_upto = offsets[last]
            # A chunk: the newest store time of the messages passed (a re-dispatched put may
            # come after newer ones), as put-by-put indexing would have covered.
            done_ts = ts if isinstance(ts, int) else max(ts) if msg == len(ts) else max(ts[:msg])
            if done_ts > self._covered_ts:
                self._covered_ts = done_ts
        return msg, hpos, failure

    def _failed(self, exc: OSError, offset: int) -> None:
        """Space is missing: retry later; logged once per stall."""
        self._retry_at = time.monotonic() + RETRY_INTERVAL_S
        if not self._stalled:
            what = "the disk is full" if exc.errno == errno.ENOSPC else "cannot create an index file"
            log.error(
                "hash index: %s in %s (%s); indexing from offset %d waits for space (puts are not affected)",
                what,
                self.store_path,
                exc,
                offset,
            )

    def _hold_from(
        self,
        hashes: array.array[int],
        counts: array.array[int],
        offsets: Sequence[int],
        ts: int | Sequence[int],
        msg: int,
        hpos: int,
    ) -> None:
        """Keep the messages from ``msg`` on (hash ``hpos``) for when space returns."""
        p = sum(c for c in counts[:msg] if c > 0)
        for i in range(msg, len(counts)):
            c = counts[i]
            if c < 0:
                continue  # skipped anyway
            start, end = max(p, hpos), p + c
            self._hold((offsets[i], ts if isinstance(ts, int) else ts[i], list(hashes[start:end])))
            p = end

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

    def _resume(self, gil: int | None = None) -> bool:
        """Retry the backlog (at most every RETRY_INTERVAL_S); True once it is all indexed."""
        gil = self._gil_keys if gil is None else gil
        if self._stopped_at is not None:
            if not self._marker_written and time.monotonic() >= self._retry_at:
                self._retry_at = time.monotonic() + RETRY_INTERVAL_S
                self._write_marker()
            return False
        if time.monotonic() < self._retry_at:
            return False
        backlog = self._backlog
        while backlog:
            offset, ts, hashes = backlog[0]
            _msg, hpos, failure = self._put(
                array.array("i", hashes), array.array("i", [len(hashes)]), [offset], ts, gil
            )
            if failure is not None:
                self._failed(failure, offset)
                backlog[0] = (offset, ts, hashes[hpos:])  # what is written stays written
                return False
            backlog.popleft()
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
        """Offsets, newest first, of messages whose ``topic#key`` hash matches in the time range.

        Indexes what is queued first: every put acknowledged before the query is found.
        """
        with self._lock:
            self._check_open()
            self._drain()
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
                self._drain()  # what was dispatched before the flush: indexed, then made durable
                if self._stalled:
                    self._resume()  # space may have come back while no message arrived
                covered = self._covered_ts
                clear_marker = self._marker_loaded and not self._stalled
                snapshot = [(f, f.header.pack()) for f in self._dirty]
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

        The newest file is kept: it carries the offset and time the next file starts from (and
        takes the keys still queued).
        """
        with self._flush_lock, self._lock:
            if not self._loaded or self._closed:
                return
            while len(self._files) > 1 and self._files[0].header.end_phy_offset < min_phy_offset:
                f = self._files.pop(0)
                self._dirty.pop(f, None)
                log.info(
                    "deleting expired index file %s (ends at offset %d)", f.name, f.header.end_phy_offset
                )
                f.destroy()

    def rebuild_from(self) -> int | None:
        """Where the store must re-dispatch from after unreadable files were skipped at load.

        The start of the last record indexed whole (a record boundary the store can scan from;
        dispatch skips that record itself), or 0 when nothing readable is left.
        """
        with self._lock:
            if self._loaded and not self._closed:
                self._drain()
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
            self._drain()  # the records re-dispatched by the recovery first
            dropped = 0
            while self._files and self._files[-1].header.end_phy_offset >= phy_end:
                f = self._files[-1]
                dropped += f.truncate_to(phy_end)
                if f.is_empty and len(self._files) > 1:
                    self._files.pop()
                    self._dirty.pop(f, None)
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
            if self._loaded and not self._closed:
                self._drain()
            return [f.name for f in self._files]

    def stats(self) -> dict[str, int]:
        """File count, entries indexed and the index thread's lag, for monitoring."""
        with self._lock:
            if self._loaded and not self._closed:
                self._drain()
            return {
                "files": len(self._files),
                "entries": sum(f.header.index_count - 1 for f in self._files),
                "covered_timestamp": self._covered_ts,
                "lag_max_ms": round(self._lag_max_s * 1000),
                "put_drains": self._put_drains,
                "inline_drains": self._inline_drains,
                "wakeups": self._wakeups,
                "thread_rounds": self._thread_rounds,
                "keyless_puts": self._keyless_puts,
            }
