"""The ``mmap`` message store (RocketMQ's DefaultMessageStore): the facade over its services.

Write path: records are validated, CRC'd and sized outside the lock (``RecordEncoder.prepare``);
under the one store lock the commit log picks the file (writing the blank end marker if needed),
each record is packed once with its offsets and store time (a batch into a buffer written with
one ``pwrite``, a single small record in place through the mapping over reserved blocks), and its
ConsumeQueue entry written, so the message is readable when the lock is released.  Dispatchers
(the key index) run under the same lock, in commit-log order, so a key is queryable once the put
resolves (under the GIL a separate thread would only add a handoff).  The future then waits on
the flush policy.  Arrival listeners run on the store's dispatch thread, coalesced per queue.

The services, each in its own module as RocketMQ names them: recovery at load
(:mod:`.recovery`), the consume-queue table and the dispatch of stored records (:mod:`.reput`),
arrival notification (:class:`tidemq.store.ArrivalNotifier`, shared with the memory store), and
the service thread that flushes metadata and deletes expired files (:mod:`.cleanup`).

Directory layout under the data dir: ``commitlog/``, ``consumequeue/<topic>/<queueId>/``,
``checkpoint``, ``abort`` (present while running: its presence at load means a crash).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import attrs

from tidemq.compression import compress
from tidemq.datadir import DataDirLock, lock_data_dir
from tidemq.delay import DEFAULT_DELAY_LEVELS, SCHEDULE_TOPIC, parse_delay_levels
from tidemq.errors import MessageTooLargeError, StoreError
from tidemq.filter import MessageFilter
from tidemq.flush import FlushPolicy, RoundFlushPolicy, SubmittingFlushPolicy
from tidemq.futures import StoreFuture
from tidemq.message import (
    COMPRESSED_FLAG,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    RecordEncoder,
    local_ip,
)
from tidemq.names import InvalidNameError
from tidemq.store import (
    DEFAULT_IN_MEMORY_RATIO,
    ArrivalInterest,
    ArrivalNotifier,
    Dispatcher,
    GetResult,
    PullLane,
    PutResult,
    PutStatus,
    SendLane,
    memory_for_messages,
)

from . import reader
from .allocate_service import AllocateService
from .checkpoint import StoreCheckpoint
from .cleanup import CleanService, FlushConsumeQueueService
from .commitlog import COMPILED_BATCH, CommitLog, CommitLogFullError, RecordEncodeError
from .group_put import put_groups
from .introspection import MmapIntrospection
from .lane import compiled_send_lane
from .options import MmapStoreOptions, parse_host
from .pull_lane import compiled_pull_lane
from .recovery import StoreRecovery
from .reput import NOT_CONSUMABLE, ConsumeQueueTable, Reput
from .transient_pool import transient_pool_for
from .truncate import truncate_commit_log

log = logging.getLogger(__name__)


_PUT_OK = PutStatus.PUT_OK
#: What :meth:`MmapMessageStore._prepare` gives a put it takes: its messages (compressed when the
#: store compresses), the prepared records, whether they are the compiled encoder's, the topic,
#: the queue id and whether the records get consume-queue entries.
_Prepared = tuple[Sequence[MessageInner], Any, bool, str, int, bool]
_MIXED_BATCH = "a batch must go to one topic and queue"


def _one_queue(msgs: Sequence[MessageInner], topic: str, queue_id: int) -> bool:
    """Whether every message of a batch goes to ``topic`` and ``queue_id``."""
    for m in msgs:
        if m.topic != topic or m.queue_id != queue_id:
            return False
    return True


class MmapMessageStore(MmapIntrospection):
    """RocketMQ's DefaultMessageStore on memory-mapped files (its figures: :class:`MmapIntrospection`)."""

    def __init__(
        self,
        root: Path,
        options: MmapStoreOptions,
        flush_policy: FlushPolicy,
        index: Any | None = None,
        settings: dict[str, Any] | None = None,
    ):
        settings = dict(settings or {})
        self.root = Path(root)
        self.options = options
        self.flush_policy = flush_policy
        #: Optional fast path of the built-in policies: ``submit(end, future, value, on_timeout)``
        #: resolves ``future`` with ``value`` once durable (``on_timeout()`` after the timeout).
        self._flush_submit: Callable[[int, Future[Any], Any, Callable[[], Any]], None] | None = (
            flush_policy.submit if isinstance(flush_policy, SubmittingFlushPolicy) else None
        )
        self.index = index
        self.max_message_size = options.max_message_size or int(
            settings.get("max_message_size", 4 * 1024 * 1024)
        )
        address = (
            options.store_host or settings.get("advertise") or settings.get("listen") or "127.0.0.1:10911"
        )
        self.store_host = parse_host(str(address))
        #: Delay per level (ms): schedule-topic queue entries carry the delivery time as tags code.
        self.delay_levels = parse_delay_levels(str(settings.get("delay_levels") or DEFAULT_DELAY_LEVELS))
        self.transient_pool = transient_pool_for(options)
        #: A pull reading further behind the log's end is told to read from a slave
        #: (:class:`tidemq.store.InMemoryWindow`; the broker sets it from its option).
        self.memory_for_messages = memory_for_messages(DEFAULT_IN_MEMORY_RATIO)
        self.allocator = (
            AllocateService(
                pool=self.transient_pool,
                reserve_blocks=options.reserve_blocks,
                warm_up=options.warm_up,
                allocate=options.file_allocation,
            )
            if options.preallocate
            else None
        )
        self.commitlog = CommitLog(
            self.root / "commitlog",
            options.commitlog_file_size,
            self.allocator,
            pool=self.transient_pool,
            allocate=options.file_allocation,
        )
        #: The policy answers each put after the flush round that covers it (group commit): a
        #: put of several groups hands it each group's future (put_message_groups), as it
        #: gathers a round's futures; any other policy gets one hand-off per call.
        self._flush_rounds = isinstance(flush_policy, RoundFlushPolicy) and flush_policy.flushes_in_rounds
        if self._flush_rounds:
            self.commitlog.use_flush_rounds()  # group commit: a flush every few puts
        self.checkpoint: StoreCheckpoint | None = None
        self._lock = threading.Lock()
        self.cqs = ConsumeQueueTable(self.root / "consumequeue", options)
        self.notifier = ArrivalNotifier(self._lock, "store-dispatch")
        self.reput = Reput(self.commitlog, self.cqs, self.delay_levels, self.notifier)
        self.flusher = FlushConsumeQueueService(self.commitlog, self.cqs, index)
        self.cleaner = CleanService(
            self.root, options, self.commitlog, self.cqs, self._lock, index, self.flusher
        )
        self._needs_dispatch = False  # any dispatcher or arrival listener: the put path skips them otherwise
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._running = False
        self._loaded = False
        self._dir_lock: DataDirLock | None = None
        if index is not None:
            self.add_dispatcher(index)

    @property
    def store_host(self) -> tuple[str, int]:
        """STOREHOSTADDRESS of new records (the broker sets it once its port is bound)."""
        return self._store_host

    @store_host.setter
    def store_host(self, host: tuple[str, int]) -> None:
        try:
            encoder = RecordEncoder(host, self.max_message_size)
        except ValueError:  # a name, not an address: records need an IP (as parse_host does)
            host = (local_ip(), int(host[1]))
            encoder = RecordEncoder(host, self.max_message_size)
        self._encoder = encoder  # before publishing the host
        self._store_host = host

    # ------------------------------------------------------------------ lifecycle
    @property
    def abort_file(self) -> Path:
        return self.root / "abort"

    def load(self) -> bool:
        """Open files and recover; ``False`` (with the reason logged) when the data is unusable.

        Raises :class:`~tidemq.datadir.DataDirInUseError` when another process has the directory.
        """
        if self._dir_lock is None:
            # Before the abort file is read: a live store's abort file is not a crash.
            self._dir_lock = lock_data_dir(self.root, "tidemq store")
        last_exit_ok = not self.abort_file.exists()
        self.checkpoint = self.flusher.checkpoint = StoreCheckpoint(self.root / "checkpoint")
        recovery = StoreRecovery(
            self.root, self.options, self.commitlog, self.checkpoint, self.cqs, self.reput, self.index
        )
        if not recovery.run(last_exit_ok):
            self._release_dir_lock()
            return False
        self._loaded = True
        return True

    def _release_dir_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def start(self) -> None:
        if not self._loaded:
            raise StoreError("store.start() called before a successful load()")
        self.abort_file.touch()
        self.check_disk()
        if self.transient_pool is not None:
            self.transient_pool.init()
        self.flush_policy.start(self.commitlog)
        self._stop.clear()
        self._running = True
        self.notifier.start()
        t = threading.Thread(target=self.cleaner.run, args=(self._stop,), name="store-service", daemon=True)
        t.start()
        self._threads.append(t)

    def shutdown(self) -> None:
        """Flush everything, stop the threads, close the files and mark a clean exit."""
        if not self._running:
            self._release_dir_lock()
            return
        self._running = False
        with self._lock:  # no put is half-way through once we hold it
            pass
        self._stop.set()
        self.notifier.stop()
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []
        clean = True
        for what, step in (
            ("flush policy", self.flush_policy.shutdown),
            ("commit log", lambda: (self.commitlog.commit(0), self.commitlog.flush(0))),
            ("metadata", lambda: self.flusher.flush(thorough=True)),
        ):
            try:
                step()
            except OSError as exc:
                # A full disk must not stop the shutdown; the abort file stays, so the next start
                # re-checks everything from the commit log (abnormal recovery).
                log.error("shutdown: cannot flush the %s: %s", what, exc)
                clean = False
        if self.index is not None:
            self.index.shutdown()
        if self.allocator is not None:
            self.allocator.shutdown()
        self.commitlog.shutdown()  # joins its zeros-ahead thread first
        self.cqs.shutdown()
        if self.transient_pool is not None:
            self.transient_pool.destroy()
        if clean:
            self.abort_file.unlink(missing_ok=True)
        self._release_dir_lock()

    # ------------------------------------------------------------------ listeners
    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        self.reput.dispatchers.append(dispatcher)
        self._needs_dispatch = True

    def add_arrival_listener(
        self,
        listener: Callable[[str, int, int], None],
        interested: Callable[[str, int], bool] | None = None,
    ) -> None:
        self.notifier.add_listener(listener, interested)
        self._needs_dispatch = True

    def arrival_interest(self) -> ArrivalInterest:
        """:class:`tidemq.store.ArrivalInterests`: the one map of waited-on queues that the
        broker's listeners register in (one lookup per put instead of a call per listener)."""
        return self.notifier.interest

    # ------------------------------------------------------------------ request lanes
    def send_lane(self) -> SendLane | None:
        """The compiled SEND_MESSAGE_V2 lane (:class:`tidemq.store.RequestLanes`), None when off."""
        return compiled_send_lane() if self.options.request_lanes else None

    def pull_lane(self) -> PullLane | None:
        """The compiled PULL_MESSAGE lane (:class:`tidemq.store.PullLanes`), None when off."""
        if not self.options.request_lanes:
            return None
        return compiled_pull_lane(
            self.cqs, self.commitlog, self.options.check_crc_on_read, lambda: self.memory_for_messages
        )

    # ------------------------------------------------------------------ writes
    def put_message(self, msg: MessageInner) -> Future[PutResult]:
        return self.put_messages((msg,))

    def put_messages(self, msgs: Sequence[MessageInner]) -> Future[PutResult]:
        fut: Future[PutResult] = StoreFuture()
        result = self._append(msgs)
        if result.status is not _PUT_OK:
            fut.set_result(result)
            return fut
        end = result.wrote_offset + result.wrote_bytes
        submit = self._flush_submit
        if submit is not None:
            # The policy resolves our future itself: no second future, no callback hop per put.
            submit(end, fut, result, lambda: attrs.evolve(result, status=PutStatus.FLUSH_DISK_TIMEOUT))
            return fut
        flushed = self.flush_policy.request(end)

        def done(f: Future[bool]) -> None:
            ok = not f.cancelled() and f.exception() is None and f.result()
            fut.set_result(result if ok else attrs.evolve(result, status=PutStatus.FLUSH_DISK_TIMEOUT))

        if flushed.done():
            done(flushed)
        else:
            flushed.add_done_callback(done)
        return fut

    def put_message_groups(self, groups: Sequence[Sequence[MessageInner]]) -> list[Future[PutResult]]:
        """Several puts in one call (:class:`tidemq.store.GroupPut`): one hold of the lock, the
        groups that fit the current file written with one ``pwrite`` (:mod:`.group_put`)."""
        return put_groups(self, groups)

    def _illegal(self, error: str, status: PutStatus = PutStatus.MESSAGE_ILLEGAL) -> PutResult:
        return PutResult(status, error=error)

    def _prepare(self, msgs: Sequence[MessageInner]) -> PutResult | _Prepared:
        """Everything of a put that can fail on bad input, outside the lock: the refusal, or the
        records validated, CRC'd and sized (``encoder.prepare``) with what the write needs.

        Raises what the encoder raises beyond the refusals it is known for (a bug: the put's
        caller logs it)."""
        if not self._running:
            return self._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
        disk_full = self.cleaner.disk_full
        if disk_full:
            return self._illegal(disk_full, PutStatus.DISK_FULL)
        if not msgs:
            return self._illegal("empty message batch")
        first = msgs[0]
        topic, queue_id = first.topic, first.queue_id
        if not topic:
            return self._illegal("empty topic name")
        if queue_id < 0:
            return self._illegal(f"queue id {queue_id} is negative")
        multi = len(msgs) > 1
        if self.options.compression != "none":
            if multi and not _one_queue(msgs, topic, queue_id):
                return self._illegal(_MIXED_BATCH)
            multi = False  # checked
            msgs = [self._compressed(m) for m in msgs]
        encoder = self._encoder
        try:
            batch = encoder.prepare(msgs)
        except Exception as exc:
            # A batch to several queues is refused as such, whatever else is wrong with it.
            if multi and not _one_queue(msgs, topic, queue_id):
                return self._illegal(_MIXED_BATCH)
            if isinstance(exc, MessageTooLargeError):
                status = (
                    PutStatus.PROPERTIES_SIZE_EXCEEDED
                    if "properties" in str(exc)
                    else PutStatus.MESSAGE_ILLEGAL
                )
                return self._illegal(str(exc), status)
            if isinstance(exc, ValueError):  # a host that is not an IP address
                return self._illegal(f"cannot encode the message: {exc}")
            raise
        # The compiled batch read every message's topic and queue (``uniform``), its properties and
        # flags (the dispatchers' columns), and places and describes the records in one call each.
        compiled = type(batch) is COMPILED_BATCH
        if multi and not (cast(Any, batch).uniform if compiled else _one_queue(msgs, topic, queue_id)):
            return self._illegal(_MIXED_BATCH)
        # Prepared and rolled-back transaction halves are not consumable: no queue entry.
        consumable = first.sys_flag & TRANSACTION_TYPE_MASK not in NOT_CONSUMABLE
        return (msgs, batch, compiled, topic, queue_id, consumable)

    def _append(self, msgs: Sequence[MessageInner]) -> PutResult:
        """Append, index and dispatch under the lock; the message is readable when it returns."""
        prepared = self._prepare(msgs)
        if type(prepared) is PutResult:
            return prepared
        msgs, batch, compiled, topic, queue_id, consumable = cast(_Prepared, prepared)
        encoder = self._encoder
        # The compiled batch's own fields (``uniform``, ``cq_entries``, ``properties``...): its type
        # exists only where the extension is built, so the checker sees it through ``Any``.
        native: Any = batch
        tags = batch.tags_codes
        total = batch.total
        sizes = batch.sizes
        cqs = self.cqs
        reput = self.reput
        commitlog = self.commitlog
        with self._lock:
            if not self._running:
                return self._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
            try:
                cq = cqs.for_write(topic, queue_id) if consumable else None
                mf = commitlog.file_for(total)
            except (CommitLogFullError, InvalidNameError) as exc:
                return self._illegal(str(exc))
            except OSError as exc:
                return self.cleaner.create_failed(exc)
            queue_offset = cq.max_offset_in_queue if cq is not None else 0
            start = mf.wrote_position
            base = mf.file_from_offset + start
            ts = time.time_ns() // 1_000_000
            step = 1 if cq is not None else 0
            if topic == SCHEDULE_TOPIC and cq is not None:
                tags = [reput.schedule_tags(m.properties, ts, t) for m, t in zip(msgs, tags, strict=True)]
            try:
                offsets = commitlog.append_records(mf, encoder, batch, queue_offset, ts, step)
            except RecordEncodeError as exc:
                return self._illegal(str(exc))
            except OSError as exc:
                return self.cleaner.write_failed(mf.path.name, exc)
            try:
                if cq is not None:
                    cq.put_records(
                        offsets, sizes, tags, queue_offset, base, total, native if compiled else None
                    )
            except OSError as exc:
                # A queue file could not be created: take the record back so no queue offset is
                # used twice, and report it; the store stays up.
                try:
                    commitlog.rollback(mf, start)
                except OSError as wipe:  # zeros over bytes just written need no new block: rare
                    log.error("cannot take back the record at %d: %s", base, wipe)
                log.error("cannot write the queue entry of %s-%d: %s", topic, queue_id, exc)
                return self.cleaner.create_failed(exc)
            mf.store_timestamp = ts
            reput.reput_from = base + total
            if cq is not None:
                cqs.last_entry_ts = ts
            if self._needs_dispatch:
                # In the lock: dispatchers see commit-log order, and a key is queryable by the
                # time the put resolves.  Under the GIL a separate thread would only add a handoff.
                # One call per batch; recovery and replication end in the same Reput.dispatch.
                columns = (native.properties, native.sys_flags) if compiled else None
                if cq is not None:
                    reput.dispatch(msgs, offsets, sizes, tags, ts, queue_offset, True, columns)
                else:
                    reput.dispatch(msgs, offsets, sizes, tags, ts, -1, False, columns)
        if compiled:
            return cast(Any, encoder).put_result(PutResult, _PUT_OK, batch, queue_offset, ts)
        return PutResult(
            PutStatus.PUT_OK,
            wrote_offset=base,
            wrote_bytes=total,
            queue_offset=queue_offset,
            msg_ids=self._encoder.message_ids(offsets),
            store_timestamp=ts,
            message_count=len(offsets),
        )

    def _compressed(self, m: MessageInner) -> MessageInner:
        if m.sys_flag & COMPRESSED_FLAG or len(m.body) < self.options.compression_min_size:
            return m
        # zstd at its default level 3: the put path pays for it (clients compress at 5).
        body, bits = compress(m.body, self.options.compression, level=3)
        return attrs.evolve(m, body=body, sys_flag=m.sys_flag | bits)

    # ------------------------------------------------------------------ reads
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        message_filter: MessageFilter | None = None,
        max_bytes: int = 256 * 1024,
    ) -> GetResult:
        """Follows DefaultMessageStore.getMessage: statuses and next_begin_offset as RocketMQ's master
        (:func:`.reader.get_message`)."""
        return reader.get_message(
            self.cqs,
            self.commitlog,
            topic,
            queue_id,
            offset,
            max_count,
            message_filter,
            max_bytes,
            self.options.check_crc_on_read,
            self.memory_for_messages,
        )

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.cqs.find(topic, queue_id)
        return cq.max_offset_in_queue if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.cqs.find(topic, queue_id)
        return cq.min_offset_in_queue if cq is not None else 0

    def get_commit_log_offset(self, topic: str, queue_id: int, offset: int) -> int:
        entry = self.cqs.entry(topic, queue_id, offset)
        return entry[0] if entry is not None else -1

    def get_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        entry = self.cqs.entry(topic, queue_id, offset)
        if entry is None or entry[1] == 0x7FFFFFFF:
            return -1
        return self.commitlog.pickup_store_timestamp(entry[0], entry[1])

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Binary search for the first offset stored at or after ``timestamp_ms`` (max offset if none)."""
        cq = self.cqs.find(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self.get_store_time(topic, queue_id, mid)
            if ts < 0:  # cleaned while we searched: everything below is gone
                lo = mid + 1
            elif ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def look_message_by_offset(self, commit_log_offset: int, size: int = -1) -> bytes | None:
        return self.commitlog.get_message(commit_log_offset, size)

    def get_max_phy_offset(self) -> int:
        return self.commitlog.get_max_offset()

    def get_min_phy_offset(self) -> int:
        return self.commitlog.get_min_offset()

    @property
    def commit_log_file_size(self) -> int:
        return self.commitlog.file_size

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        """Raw commit-log bytes from ``offset`` to the end of its file (for replication)."""
        return self.commitlog.get_data_from(offset)

    def append_to_commit_log(self, start_offset: int, data: bytes | memoryview) -> bool:
        """Append raw commit-log bytes replicated from a master (RocketMQ's appendToCommitLog).

        ``start_offset`` must be this log's end.  Complete records are then indexed into their
        ConsumeQueues and dispatched (:meth:`Reput.reput`); a record split across calls is
        indexed when its last bytes arrive.  Returns ``False`` (nothing written) when the offset
        does not match.
        """
        with self._lock:
            if not self._running:
                return False
            end = self.commitlog.get_max_offset()
            if start_offset != end and not (end == 0 and not self.commitlog.queue.files):
                return False
            if not self.commitlog.queue.files:
                self.reput.reput_from = start_offset
            try:
                if not self.commitlog.append_data(start_offset, data):
                    return False
            except OSError:
                # Disk full on the slave: keep what was written, index it, and let the master resend.
                self.reput.reput()
                return False
            self.reput.reput()
            end = self.commitlog.get_max_offset()
        self.flush_policy.request(end)
        return True

    def truncate_commit_log(self, offset: int) -> int:
        """Cut the log back to the last record boundary at or below ``offset``; the new end (:mod:`.truncate`)."""
        return truncate_commit_log(self, offset)

    def topics(self) -> dict[str, list[int]]:
        return self.cqs.topics()

    def delete_topics(self, topics: Sequence[str]) -> None:
        with self._lock:
            self.cqs.delete_topics(topics)

    # ------------------------------------------------------------------ cleanup (cleanup.py)
    def check_disk(self) -> float:
        """Refuse (or accept again) writes by the disk's fill ratio; returns the ratio in percent."""
        return self.cleaner.check_disk()

    def clean_expired(self, *, manual: bool = False, now: float | None = None) -> int:
        """Delete expired commit-log files, then the queue entries and index files below them."""
        return self.cleaner.clean_expired(manual=manual, now=now)
