"""The ``mmap`` message store: CommitLog + ConsumeQueues + checkpoint, recovery and cleanup.

Write path: records are validated, CRC'd and sized outside the lock (``RecordEncoder.prepare``);
under the one store lock the commit log picks the file (writing the blank end marker if needed),
each record is packed once with its offsets and store time (a batch into a buffer written with
one ``pwrite``, a single small record in place through the mapping over reserved blocks), and its
ConsumeQueue entry written, so the message is readable when the lock is released.  Dispatchers
(the key index) run under the same lock, in commit-log order, so a key is queryable once the put
resolves (under the GIL a separate thread would only add a handoff).  The future then waits on
the flush policy.  Arrival listeners run on the store's dispatch thread,
coalesced per queue.

Directory layout under the data dir: ``commitlog/``, ``consumequeue/<topic>/<queueId>/``,
``checkpoint``, ``abort`` (present while running: its presence at load means a crash).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs

from tidemq.compression import compress
from tidemq.datadir import DataDirLock, lock_data_dir
from tidemq.delay import DEFAULT_DELAY_LEVELS, SCHEDULE_TOPIC, parse_delay_levels, schedule_tags_code
from tidemq.errors import CorruptDataError, MessageTooLargeError, StoreError
from tidemq.filter import EntryPrefilter, MessageFilter
from tidemq.flush import FlushPolicy, SubmittingFlushPolicy
from tidemq.index import RecoverableIndex
from tidemq.message import (
    COMPRESSED_FLAG,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    RecordEncoder,
    decode_message,
    local_ip,
    record_crc_ok,
    record_mismatch,
    tags_hash_code,
)
from tidemq.names import InvalidNameError, check_stored_topic_name, topic_dir
from tidemq.store import (
    Dispatcher,
    GetResult,
    GetStatus,
    PutResult,
    PutStatus,
    check_queue_offset,
    dispatch_messages,
)

from .checkpoint import StoreCheckpoint
from .commitlog import CommitLog, CommitLogFullError
from .consume_queue import CQ_ENTRY, CQ_STORE_UNIT_SIZE, ConsumeQueue
from .mapped_file import AllocateService
from .options import MmapStoreOptions
from .transient_pool import TransientStorePool

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")
#: ConsumeQueue bytes scanned per pull at most (RocketMQ's maxFilterMessageCount).
MAX_FILTER_BYTES = 16000
#: Shortest time between two rounds of arrival listeners (long-polling wake-ups) under load.
ARRIVAL_ROUND_S = 0.001
_MIN = -(1 << 63)
_NOT_CONSUMABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
#: A single record up to this size is packed in place through the mapping (see _append).
_IN_PLACE_MAX = 64 * 1024


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


#: accessMessageInMemoryMaxRatio (40 %) of the machine's memory.
_MEMORY_FOR_MESSAGES = _physical_memory() * 40 // 100


#: Tags repeat across messages; Java's String.hashCode in Python costs microseconds per call.
_tags_code = functools.lru_cache(maxsize=65536)(tags_hash_code)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_host(address: str) -> tuple[str, int]:
    """``ip:port`` for STOREHOSTADDRESS; a wildcard or name becomes this machine's IP."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        import ipaddress

        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            host = local_ip()
    except ValueError:
        host = local_ip()
    return host, int(port or 0)


class MmapMessageStore:
    """RocketMQ's DefaultMessageStore on memory-mapped files."""

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
        self._wbuf = bytearray(1 << 20)  # records of one append, packed before their pwrite (lock held)
        self.transient_pool = self._transient_pool(options)
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
        self.checkpoint: StoreCheckpoint | None = None
        self._cq_root = self.root / "consumequeue"
        self._cqs: dict[str, dict[int, ConsumeQueue]] = {}
        self._lock = threading.Lock()
        self._dispatchers: list[Dispatcher] = []
        self._listeners: list[Callable[[str, int, int], None]] = []
        # Arrivals for the listeners: (topic, queue id) -> readable max offset, written under
        # _lock; the dispatch thread swaps the dict out once per round.
        self._arrivals: dict[tuple[str, int], int] = {}
        self._arrival_event = threading.Event()
        self._needs_dispatch = False
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._running = False
        self._loaded = False
        self._last_cq_ts = 0
        self._reput_from = 0  # replication: where indexing of appended raw bytes resumes
        self._disk_full = ""  # why writes are refused ("" while the disk has room)
        self._rebuild_queues = False  # a damaged consume queue was set aside at load
        self._bad_topics: set[str] = set()  # logged once each: records whose topic is no name
        self._dir_lock: DataDirLock | None = None
        if index is not None:
            self.add_dispatcher(index)

    @staticmethod
    def _transient_pool(options: MmapStoreOptions) -> TransientStorePool | None:
        if not options.transient_store_pool:
            return None
        need = options.transient_store_pool_size * options.commitlog_file_size
        memory = _physical_memory()
        if memory and need > memory // 2:
            raise StoreError(
                f"the transient store pool needs transient_store_pool_size "
                f"{options.transient_store_pool_size} x commitlog_file_size {options.commitlog_file_size} "
                f"= {need >> 20} MiB of resident memory, over half of this machine's {memory >> 20} MiB: "
                f"lower one of them or set transient_store_pool = false"
            )
        return TransientStorePool(options.transient_store_pool_size, options.commitlog_file_size)

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
        if not self._load():
            self._release_dir_lock()
            return False
        return True

    def _release_dir_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _load(self) -> bool:
        last_exit_ok = not self.abort_file.exists()
        self.checkpoint = StoreCheckpoint(self.root / "checkpoint")
        try:
            self.commitlog.queue.load()
            self._load_consume_queues()
        except StoreError as exc:
            log.error("store load failed: %s", exc)
            return False
        if self.index is not None:
            self.index.load(last_exit_ok, self.checkpoint.index_msg_timestamp)
        for cq in self._all_cqs():
            cq.recover()
        crc = self.options.check_crc_on_recover
        # Per queue, what the recovery scan saw: [first queue offset, its log offset, last queue offset].
        seen: dict[tuple[str, int], list[int]] = {}

        def note(msg: MessageExt) -> None:
            if self._consumable(msg.sys_flag):
                first = seen.get((msg.topic, msg.queue_id))
                if first is None:
                    seen[(msg.topic, msg.queue_id)] = [
                        msg.queue_offset,
                        msg.commit_log_offset,
                        msg.queue_offset,
                    ]
                else:
                    first[2] = msg.queue_offset

        if last_exit_ok:
            end = self.commitlog.recover_normally(crc, note)
        else:
            log.warning("store %s did not exit cleanly: abnormal recovery", self.root)
            min_ts = self.checkpoint.min_timestamp(self.index is not None)

            def note_and_redispatch(msg: MessageExt) -> None:
                note(msg)
                self._redispatch(msg)

            end = self.commitlog.recover_abnormally(min_ts, crc, note_and_redispatch)
        cl_min = self.commitlog.get_min_offset()
        for cq in self._all_cqs():
            cq.truncate_dirty(end)
            cq.correct_min_offset(cl_min)
        queues_from = self._queues_behind(seen, end)
        # A crash that lost the log's tail (an uncommitted transient buffer) leaves index entries
        # for records that are gone and whose offsets new records will reuse: drop them.
        if isinstance(self.index, RecoverableIndex):
            self.index.truncate(end)
        # Re-dispatch what the consume queues had not indexed yet (RocketMQ's reputFromOffset).
        reput_from = max([cl_min, *(cq.max_physic_offset for cq in self._all_cqs())])
        if queues_from is not None:
            reput_from = min(reput_from, max(cl_min, queues_from))
        if self._rebuild_queues:
            reput_from = cl_min  # re-dispatch is idempotent for the queues that are whole
        index_from = self.index.rebuild_from() if isinstance(self.index, RecoverableIndex) else None
        if index_from is not None:  # index files were unreadable: index their records again
            reput_from = min(reput_from, max(cl_min, index_from))
        for _, msg in self.commitlog.iter_records(reput_from):
            self._redispatch(msg)
        self._reput_from = self.commitlog.get_max_offset()
        self._loaded = True
        log.info(
            "store %s loaded: commit log [%d, %d), %d queues",
            self.root,
            cl_min,
            end,
            len(list(self._all_cqs())),
        )
        return True

    def _queues_behind(self, seen: dict[tuple[str, int], list[int]], end: int) -> int | None:
        """Compare each queue with the records recovery saw of it; where re-dispatch must start.

        The re-dispatch after load starts where the most advanced queue ends (RocketMQ's
        reputFromOffset), which would leave a queue that lost its files or its last entries
        behind for good, and hand its next message a queue offset already used.  Recovery has
        just read the records of the last files: a queue holding fewer entries than they show is
        caught up from its first record there, or rebuilt from the start of the log when it
        lacks even that one.  Returns the log offset to re-dispatch from (None: no queue behind).
        """
        start: int | None = None
        for (topic, queue_id), (first_qoff, first_phy, last_qoff) in seen.items():
            if first_phy >= end:
                continue  # cut with the tail
            cq = self._find_cq(topic, queue_id)
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
            self._rebuild_queues = True
        return start

    def _load_consume_queues(self) -> None:
        if not self._cq_root.exists():
            return
        entries = self.options.consumequeue_entries
        for tdir in sorted(self._cq_root.iterdir()):
            if not tdir.is_dir():
                continue
            problem = check_stored_topic_name(tdir.name)
            if problem:
                log.error("consume queue directory %s ignored: %s", tdir, problem)
                continue
            for qdir in sorted(tdir.iterdir()):
                if not qdir.is_dir() or not qdir.name.lstrip("-").isdigit():
                    continue
                cq = ConsumeQueue(
                    tdir.name, int(qdir.name), self._cq_root, entries, self.options.file_allocation
                )
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
                    self._rebuild_queues = True
                    continue
                self._cqs.setdefault(tdir.name, {})[int(qdir.name)] = cq

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
        for name, target in (("dispatch", self._dispatch_loop), ("service", self._service_loop)):
            t = threading.Thread(target=target, name=f"store-{name}", daemon=True)
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
        self._arrival_event.set()
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []
        clean = True
        for what, step in (
            ("flush policy", self.flush_policy.shutdown),
            ("commit log", lambda: (self.commitlog.commit(0), self.commitlog.flush(0))),
            ("metadata", lambda: self._flush_metadata(thorough=True)),
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
        self.commitlog.queue.shutdown()
        for cq in self._all_cqs():
            cq.shutdown()
        if self.transient_pool is not None:
            self.transient_pool.destroy()
        if clean:
            self.abort_file.unlink(missing_ok=True)
        self._release_dir_lock()

    # ------------------------------------------------------------------ listeners
    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        self._dispatchers.append(dispatcher)
        self._needs_dispatch = True

    def add_arrival_listener(self, listener: Callable[[str, int, int], None]) -> None:
        self._listeners.append(listener)
        self._needs_dispatch = True

    # ------------------------------------------------------------------ writes
    def put_message(self, msg: MessageInner) -> Future[PutResult]:
        return self.put_messages((msg,))

    def put_messages(self, msgs: Sequence[MessageInner]) -> Future[PutResult]:
        fut: Future[PutResult] = Future()
        result = self._append(msgs)
        if result.status is not PutStatus.PUT_OK:
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

    def _illegal(self, error: str, status: PutStatus = PutStatus.MESSAGE_ILLEGAL) -> PutResult:
        return PutResult(status, error=error)

    def _append(self, msgs: Sequence[MessageInner]) -> PutResult:
        """Append, index and dispatch under the lock; the message is readable when it returns."""
        if not self._running:
            return self._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
        if self._disk_full:
            return self._illegal(self._disk_full, PutStatus.DISK_FULL)
        if not msgs:
            return self._illegal("empty message batch")
        first = msgs[0]
        topic, queue_id = first.topic, first.queue_id
        if not topic:
            return self._illegal("empty topic name")
        if queue_id < 0:
            return self._illegal(f"queue id {queue_id} is negative")
        if len(msgs) > 1:
            for m in msgs:
                if m.topic != topic or m.queue_id != queue_id:
                    return self._illegal("a batch must go to one topic and queue")
        if self.options.compression != "none":
            msgs = [self._compressed(m) for m in msgs]
        # Everything that can fail on bad input happens here, outside the lock.
        try:
            batch = self._encoder.prepare(msgs)
        except MessageTooLargeError as exc:
            status = (
                PutStatus.PROPERTIES_SIZE_EXCEEDED if "properties" in str(exc) else PutStatus.MESSAGE_ILLEGAL
            )
            return self._illegal(str(exc), status)
        except ValueError as exc:  # a host that is not an IP address
            return self._illegal(f"cannot encode the message: {exc}")
        tags = batch.tags_codes
        # Prepared and rolled-back transaction halves are not consumable: no queue entry.
        consumable = first.sys_flag & TRANSACTION_TYPE_MASK not in _NOT_CONSUMABLE
        total = batch.total
        sizes = batch.sizes
        with self._lock:
            if not self._running:
                return self._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
            try:
                cq = self._cq_for_write(topic, queue_id) if consumable else None
                mf = self.commitlog.file_for(total)
            except (CommitLogFullError, InvalidNameError) as exc:
                return self._illegal(str(exc))
            except OSError as exc:
                return self._create_failed(exc)
            queue_offset = cq.max_offset_in_queue if cq is not None else 0
            start = mf.wrote_position
            base = mf.file_from_offset + start
            ts = now_ms()
            step = 1 if cq is not None else 0
            if topic == SCHEDULE_TOPIC and cq is not None:
                tags = [self._schedule_tags(m.properties, ts, t) for m, t in zip(msgs, tags, strict=True)]
            try:
                # One small record: packed in place through the mapping once its blocks are reserved
                # (no syscall, no GIL hand-off between concurrent writers).  Batches: see below.
                in_place = mf.transient or (
                    len(sizes) == 1 and total <= _IN_PLACE_MAX and mf.reserve(start + total)
                )
            except OSError as exc:
                return self._write_failed(mf, start, 0, exc)
            if in_place:
                # Pack straight into the mapping or the off-map write buffer (the policy commits it).
                try:
                    offsets = self._encoder.write_into(
                        mf.write_buffer(), start, batch, queue_offset, base, ts, step
                    )
                except (struct.error, TypeError, OverflowError) as exc:
                    # A field out of its Java range (flag, timestamps...): wipe what was packed past
                    # the write position so it can never be committed, and refuse the batch.
                    mf.write_at(start, bytes(total))
                    return self._illegal(f"cannot encode the message: {exc}")
            else:
                # Pack into one reused buffer, then one pwrite into the file: the kernel copies into
                # the page cache without a page fault per 4 KiB page, which writing through the
                # mapping costs (2-3x slower on fresh pages); readers see the same pages through it.
                # On a full disk pwrite fails with ENOSPC where a sparse mapping would SIGBUS.
                buf = self._wbuf
                if len(buf) < total:
                    buf = self._wbuf = bytearray(max(total, 2 * len(buf)))
                try:
                    offsets = self._encoder.write_into(buf, 0, batch, queue_offset, base, ts, step)
                except (struct.error, TypeError, OverflowError) as exc:
                    return self._illegal(f"cannot encode the message: {exc}")
                try:
                    with memoryview(buf) as view:
                        mf.pwrite(start, view[:total])
                except OSError as exc:
                    return self._write_failed(mf, start, total, exc)
            mf.advance(total)
            try:
                if cq is not None:
                    if len(offsets) == 1:
                        cq.put(base, total, tags[0], queue_offset)
                    else:
                        cq.put_packed(b"".join(map(CQ_ENTRY.pack, offsets, sizes, tags)), queue_offset)
            except OSError as exc:
                # A queue file could not be created: take the record back so no queue offset is
                # used twice, and report it; the store stays up.
                try:
                    self.commitlog.rollback(mf, start)
                except OSError as wipe:  # zeros over bytes just written need no new block: rare
                    log.error("cannot take back the record at %d: %s", base, wipe)
                log.error("cannot write the queue entry of %s-%d: %s", topic, queue_id, exc)
                return self._create_failed(exc)
            mf.store_timestamp = ts
            self._reput_from = base + total
            if cq is not None:
                self._last_cq_ts = ts
            if self._needs_dispatch:
                qoff = queue_offset if cq is not None else -1
                if self._dispatchers:
                    # In the lock: dispatchers see commit-log order, and a key is queryable by the
                    # time the put resolves.  Under the GIL a separate thread would only add a handoff.
                    self._dispatch_entry(msgs, offsets, sizes, tags, ts, qoff)
                if self._listeners and qoff >= 0:
                    self._arrived(topic, queue_id, qoff + len(msgs))
        prefix = self._encoder.id_prefix
        return PutResult(
            PutStatus.PUT_OK,
            wrote_offset=base,
            wrote_bytes=total,
            queue_offset=queue_offset,
            msg_ids=tuple([f"{prefix}{o:016X}" for o in offsets]),
            store_timestamp=ts,
            message_count=len(offsets),
        )

    def _compressed(self, m: MessageInner) -> MessageInner:
        if m.sys_flag & COMPRESSED_FLAG or len(m.body) < self.options.compression_min_size:
            return m
        # zstd at its default level 3: the put path pays for it (clients compress at 5).
        body, bits = compress(m.body, self.options.compression, level=3)
        return attrs.evolve(m, body=body, sys_flag=m.sys_flag | bits)

    def _write_failed(self, mf: Any, start: int, total: int, exc: OSError) -> PutResult:
        """A commit-log write failed (ENOSPC on a sparse file, EIO): nothing is published."""
        if total:
            try:
                mf.pwrite(start, bytes(total))  # best effort: no partial record left for recovery
            except OSError:
                pass
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        error = f"{'the disk is full: ' if full else ''}cannot write {mf.path.name} ({exc.strerror or exc})"
        log.error("put refused: %s", error)
        try:
            self.check_disk()
        except OSError:
            pass
        return self._illegal(error, PutStatus.DISK_FULL if full else PutStatus.UNKNOWN_ERROR)

    def _create_failed(self, exc: OSError) -> PutResult:
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
        return self._illegal(error, PutStatus.CREATE_MAPPED_FILE_FAILED)

    def _cq_for_write(self, topic: str, queue_id: int) -> ConsumeQueue:
        queues = self._cqs.get(topic)
        cq = queues.get(queue_id) if queues is not None else None
        if cq is None:
            cq = ConsumeQueue(
                topic,
                queue_id,
                self._cq_root,
                self.options.consumequeue_entries,
                self.options.file_allocation,
            )
            self._cqs.setdefault(topic, {})[queue_id] = cq
        return cq

    # ------------------------------------------------------------------ dispatch
    def _arrived(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Note that ``topic``/``queue_id`` is readable up to ``max_offset`` (``_lock`` held).

        Wakes the dispatch thread only when it has nothing pending: under load many puts share
        one wake-up instead of one GIL handoff each.
        """
        if not self._arrivals:
            self._arrival_event.set()
        self._arrivals[(topic, queue_id)] = max_offset

    def _dispatch_loop(self) -> None:
        """Arrival listeners run here, on the store's own thread, coalesced per queue.

        Rounds start at most every ARRIVAL_ROUND_S (RocketMQ's reput service also sleeps 1 ms a
        round): a long-polling pull waits at most that much longer, and a busy store wakes this
        thread a thousand times a second at most rather than once per put.
        """
        last_round = 0.0
        while True:
            self._arrival_event.wait()
            pause = last_round + ARRIVAL_ROUND_S - time.monotonic()
            if pause > 0 and not self._stop.is_set():
                time.sleep(pause)
            with self._lock:
                arrived, self._arrivals = self._arrivals, {}
                self._arrival_event.clear()
            for (topic, qid), max_offset in arrived.items():
                for listener in self._listeners:
                    try:
                        listener(topic, qid, max_offset)
                    except Exception:
                        log.exception("arrival listener %r failed", listener)
            last_round = time.monotonic()
            if self._stop.is_set():
                return

    def _dispatch_entry(
        self,
        msgs: Sequence[Any],
        offsets: list[int],
        sizes: list[int],
        tags: list[int],
        ts: int,
        queue_offset: int,
    ) -> None:
        dispatch_messages(self._dispatchers, msgs, offsets, sizes, tags, ts, queue_offset)

    def _schedule_tags(self, properties: Mapping[str, str], ts: int, tags: int) -> int:
        """A SCHEDULE_TOPIC_XXXX entry's tags code: its delivery time, as RocketMQ stores it."""
        code = schedule_tags_code(self.delay_levels, properties, ts)
        return tags if code is None else code

    def _record_tags(self, msg: MessageExt) -> int:
        tags = _tags_code(msg.tags)
        if msg.topic == SCHEDULE_TOPIC:
            return self._schedule_tags(msg.properties, msg.store_timestamp, tags)
        return tags

    def _redispatch_cq(self, msg: MessageExt) -> None:
        if self._consumable(msg.sys_flag):
            try:
                cq = self._cq_for_write(msg.topic, msg.queue_id)
            except InvalidNameError as exc:
                # A record no put could have made (replicated from a hostile or buggy master, or
                # written by hand): it stays in the log, but gets no queue and no directory.
                if msg.topic not in self._bad_topics:
                    self._bad_topics.add(msg.topic)
                    log.error("record at %d has no queue entry: %s", msg.commit_log_offset, exc)
                return
            cq.put(msg.commit_log_offset, msg.store_size, self._record_tags(msg), msg.queue_offset)
            self._last_cq_ts = msg.store_timestamp

    def _redispatch(self, msg: MessageExt) -> None:
        """Rebuild the queue entry and re-index one recovered record (load time, single-threaded)."""
        self._redispatch_cq(msg)
        if self._dispatchers:
            tags = self._record_tags(msg)
            self._dispatch_entry(
                [msg],
                [msg.commit_log_offset],
                [msg.store_size],
                [tags],
                msg.store_timestamp,
                msg.queue_offset,
            )

    # ------------------------------------------------------------------ reads
    def _find_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queues = self._cqs.get(topic)
        return queues.get(queue_id) if queues is not None else None

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
        """Follows DefaultMessageStore.getMessage: statuses and next_begin_offset as RocketMQ's master."""
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_offset = cq.min_offset_in_queue
        max_offset = cq.max_offset_in_queue
        outside = check_queue_offset(offset, min_offset, max_offset)
        if outside is not None:
            return outside
        entries = cq.get_index_buffer(offset)
        if entries is None:
            return GetResult(GetStatus.OFFSET_FOUND_NULL, cq.roll_next_file(offset), min_offset, max_offset)
        status = GetStatus.NO_MATCHED_MESSAGE
        max_phy = self.commitlog.get_max_offset()
        last_phy = 0
        buffers: list[memoryview] = []
        qoffsets: list[int] = []
        total = 0
        next_phy_file_start = _MIN
        limit = min(len(entries), max(MAX_FILTER_BYTES, max_count * CQ_STORE_UNIT_SIZE))
        limit -= limit % CQ_STORE_UNIT_SIZE
        commitlog = self.commitlog
        entry_check = (
            message_filter.matches_queue_entry if isinstance(message_filter, EntryPrefilter) else None
        )
        check_crc = self.options.check_crc_on_read
        topic_bytes = topic.encode()
        i = 0
        while i < limit:
            phy, size, tags_code = CQ_ENTRY.unpack_from(entries, i)
            last_phy = phy
            i += CQ_STORE_UNIT_SIZE
            if size == 0x7FFFFFFF:  # pre-blank filler
                continue
            if next_phy_file_start != _MIN and phy < next_phy_file_start:
                continue
            if buffers and (len(buffers) >= max_count or total + size > max_bytes):
                i -= CQ_STORE_UNIT_SIZE
                break
            if message_filter is not None and not message_filter.matches_tags_code(tags_code):
                continue
            # Optional MessageFilter.matches_queue_entry (filter_server's dispatch-time bloom bit map,
            # RocketMQ's ConsumeQueueExt): skip an entry it rules out without reading the record.
            if entry_check is not None and not entry_check(
                topic, queue_id, offset + (i - CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
            ):
                continue
            data = commitlog.get_data(phy, size)
            if data is None:
                if not buffers:
                    status = GetStatus.MESSAGE_WAS_REMOVING
                next_phy_file_start = commitlog.roll_next_file(phy)
                continue
            if message_filter is not None:
                try:
                    props = decode_message(data, with_body=False).properties
                except CorruptDataError:
                    log.error("unreadable record at commit-log offset %d (queue %s-%d)", phy, topic, queue_id)
                    continue
                if not message_filter.matches_message(props):
                    continue
            qoff = offset + (i - CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
            wrong = record_mismatch(data, size, topic_bytes, queue_id, qoff)
            if wrong is not None:
                # A damaged queue entry or zeroed log bytes: never serve another queue's record,
                # a duplicate or garbage.  `tidemq verify` names the damage; reload rebuilds.
                log.error(
                    "consume queue %s-%d entry %d points at commit-log offset %d, which holds %s; skipped",
                    topic,
                    queue_id,
                    qoff,
                    phy,
                    wrong,
                )
                continue
            if check_crc and not record_crc_ok(data):
                # Damaged on disk after recovery checked it: report it, never serve it.
                log.error(
                    "record at commit-log offset %d (queue %s-%d, offset %d) fails its body CRC; skipped",
                    phy,
                    topic,
                    queue_id,
                    qoff,
                )
                continue
            buffers.append(data)
            qoffsets.append(qoff)
            total += size
            status = GetStatus.FOUND
            next_phy_file_start = _MIN
        entries.release()
        return GetResult(
            status,
            offset + i // CQ_STORE_UNIT_SIZE,
            min_offset,
            max_offset,
            buffers=tuple(buffers),
            queue_offsets=tuple(qoffsets),
            # Reading this far behind the head means reading from disk: RocketMQ then suggests a slave.
            suggest_pulling_from_slave=max_phy - last_phy > _MEMORY_FOR_MESSAGES,
        )

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.max_offset_in_queue if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.min_offset_in_queue if cq is not None else 0

    def get_commit_log_offset(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self._find_cq(topic, queue_id)
        if cq is None or not cq.min_offset_in_queue <= offset < cq.max_offset_in_queue:
            return -1
        entry = cq.get_entry(offset)
        return entry[0] if entry is not None else -1

    def get_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self._find_cq(topic, queue_id)
        if cq is None or not cq.min_offset_in_queue <= offset < cq.max_offset_in_queue:
            return -1
        entry = cq.get_entry(offset)
        if entry is None or entry[1] == 0x7FFFFFFF:
            return -1
        return self.commitlog.pickup_store_timestamp(entry[0], entry[1])

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Binary search for the first offset stored at or after ``timestamp_ms`` (max offset if none)."""
        cq = self._find_cq(topic, queue_id)
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
        if size < 0:
            head = self.commitlog.get_data(commit_log_offset, 4)
            if head is None:
                return None
            (size,) = _I32.unpack_from(head, 0)
            if size <= 0:
                return None
        data = self.commitlog.get_data(commit_log_offset, size)
        return bytes(data) if data is not None else None

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
        ConsumeQueues and dispatched; a record split across calls is indexed when its last bytes
        arrive.  Returns ``False`` (nothing written) when the offset does not match.
        """
        with self._lock:
            if not self._running:
                return False
            end = self.commitlog.get_max_offset()
            if start_offset != end and not (end == 0 and not self.commitlog.queue.files):
                return False
            if not self.commitlog.queue.files:
                self._reput_from = start_offset
            view = memoryview(data)
            pos = 0
            try:
                while pos < len(view):
                    mf = self.commitlog.queue.get_last_mapped_file(start_offset + pos)
                    if mf is None:
                        return False
                    n = min(len(view) - pos, mf.free_space)
                    mf.append(view[pos : pos + n])
                    pos += n
            except OSError as exc:
                # Disk full on the slave: keep what was written, index it, and let the master resend.
                log.error("cannot append replicated data at %d: %s", start_offset + pos, exc)
                self._reput_locked()
                return False
            self._reput_locked()
            end = self.commitlog.get_max_offset()
        self.flush_policy.request(end)
        return True

    def _reput_locked(self) -> None:
        """Index the complete records between the reput offset and the end of the log."""
        for offset, msg in self.commitlog.iter_records(self._reput_from):
            self._redispatch_cq(msg)
            mf = self.commitlog.queue.find_mapped_file_by_offset(offset)
            if mf is not None:
                mf.store_timestamp = msg.store_timestamp
            if self._dispatchers:
                tags = self._record_tags(msg)
                self._dispatch_entry(
                    [msg], [offset], [msg.store_size], [tags], msg.store_timestamp, msg.queue_offset
                )
            if self._listeners and self._consumable(msg.sys_flag):
                self._arrived(msg.topic, msg.queue_id, msg.queue_offset + 1)
            self._reput_from = offset + msg.store_size
        # A BLANK at the end of a file moves the reput offset to the next file.
        mf = self.commitlog.queue.find_mapped_file_by_offset(self._reput_from)
        if mf is not None and self._reput_from < self.commitlog.get_max_offset():
            view = mf.view_from(self._reput_from - mf.file_from_offset)
            if view is not None and self.commitlog.check_record(view, 0, False)[0] == "blank":
                self._reput_from = self.commitlog.roll_next_file(self._reput_from)
                self._reput_locked()

    @staticmethod
    def _consumable(sys_flag: int) -> bool:
        return sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(qs) for t, qs in list(self._cqs.items()) if qs}

    def delete_topics(self, topics: Sequence[str]) -> None:
        with self._lock:
            for t in topics:
                queues = self._cqs.pop(t, None)
                for cq in (queues or {}).values():
                    cq.destroy()
                try:
                    # A name that is no topic has no directory here: nothing outside is touched.
                    topic_dir(self._cq_root, t).rmdir()
                except (OSError, InvalidNameError):
                    pass

    # ------------------------------------------------------------------ background service
    def _all_cqs(self) -> list[ConsumeQueue]:
        return [cq for qs in list(self._cqs.values()) for cq in list(qs.values())]

    def _service_loop(self) -> None:
        flush_every = self.options.cq_flush_interval_ms / 1000
        clean_every = self.options.clean_interval_ms / 1000
        next_flush = time.monotonic() + flush_every
        next_clean = time.monotonic() + clean_every
        flush_failing = False
        while not self._stop.wait(min(flush_every, clean_every, 0.5)):
            now = time.monotonic()
            try:
                # Cheap (statvfs): writes are refused within a tick of the disk filling up, and
                # accepted again within a tick of space coming back, whatever the cleanup period.
                self.check_disk()
            except OSError as exc:
                log.error("cannot check the disk: %s", exc)
            if now >= next_flush:
                next_flush = now + flush_every
                try:
                    self._flush_metadata(thorough=True)
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

    def _flush_metadata(self, thorough: bool) -> None:
        """Flush ConsumeQueues and the index, then record how far they are in the checkpoint."""
        logics_ts = self._last_cq_ts  # read before flushing: every entry up to it is then on disk
        for cq in self._all_cqs():
            cq.flush(0 if thorough else 2)
        cp = self.checkpoint
        if cp is None:
            return
        if self.commitlog.store_timestamp:
            cp.physic_msg_timestamp = self.commitlog.store_timestamp
        if logics_ts and thorough:
            cp.logics_msg_timestamp = logics_ts
        if self.index is not None:
            ts = self.index.flush()
            if ts:
                cp.index_msg_timestamp = ts
        cp.flush()

    # ------------------------------------------------------------------ cleanup
    def disk_used_ratio(self) -> float:
        usage = shutil.disk_usage(self.root)
        return usage.used / usage.total * 100 if usage.total else 0.0

    def check_disk(self) -> float:
        """Refuse (or accept again) writes by the disk's fill ratio; returns the ratio in percent."""
        ratio = self.disk_used_ratio()
        limit = self.options.disk_space_warning_ratio
        if ratio > limit:
            if not self._disk_full:
                log.error(
                    "disk %.1f%% full (limit %d%%): refusing writes until cleanup frees space", ratio, limit
                )
            self._disk_full = f"the disk is {ratio:.1f}% full (limit {limit}%); writes are refused"
        elif self._disk_full:
            log.warning("disk back to %.1f%% full: accepting writes", ratio)
            self._disk_full = ""
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
            queues = self._all_cqs()
        for cq in queues:
            cq.delete_expired(cl_min)
        if self.index is not None:
            self.index.delete_expired(cl_min)
