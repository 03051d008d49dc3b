"""The ``mmap`` message store: CommitLog + ConsumeQueues + checkpoint, recovery and cleanup.

Write path: records are encoded outside the lock; under the one store lock the commit log picks
the file (writing the blank end marker if needed), the record is patched with its offsets and
store time, appended, and its ConsumeQueue entry written, so the message is readable when the
lock is released.  Dispatchers (the key index) run under the same lock, in commit-log order, so a
key is queryable once the put resolves (under the GIL a separate thread would only add a handoff).
The future then waits on the flush policy.  Arrival listeners run on the store's dispatch thread,
coalesced per queue.

Directory layout under the data dir: ``commitlog/``, ``consumequeue/<topic>/<queueId>/``,
``checkpoint``, ``abort`` (present while running: its presence at load means a crash).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import shutil
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs

from tidemq.errors import CorruptDataError, MessageTooLargeError, StoreError
from tidemq.filter import MessageFilter
from tidemq.flush import FlushPolicy
from tidemq.message import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    MessageInner,
    Prop,
    create_message_id,
    decode_message,
    encode_message,
    local_ip,
    patch_record,
    tags_hash_code,
)
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

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")
#: ConsumeQueue bytes scanned per pull at most (RocketMQ's maxFilterMessageCount).
MAX_FILTER_BYTES = 16000
_MIN = -(1 << 63)


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


def compress_body(body: bytes, algorithm: str) -> tuple[bytes, int]:
    """Compress with lz4 (frame) or zstd; returns the body and the sysFlag bits to set."""
    if algorithm == "lz4":
        import lz4.frame

        return lz4.frame.compress(body), COMPRESSED_FLAG | COMPRESSION_LZ4
    import zstandard

    return zstandard.ZstdCompressor().compress(body), COMPRESSED_FLAG | COMPRESSION_ZSTD


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
        self.index = index
        self.max_message_size = options.max_message_size or int(
            settings.get("max_message_size", 4 * 1024 * 1024)
        )
        address = (
            options.store_host or settings.get("advertise") or settings.get("listen") or "127.0.0.1:10911"
        )
        self.store_host = parse_host(str(address))
        self.allocator = (
            AllocateService(
                transient=options.transient_store_pool,
                reserve_blocks=options.reserve_blocks,
                warm_up=options.warm_up,
            )
            if options.preallocate
            else None
        )
        self.commitlog = CommitLog(
            self.root / "commitlog",
            options.commitlog_file_size,
            self.allocator,
            transient=options.transient_store_pool,
        )
        self.checkpoint: StoreCheckpoint | None = None
        self._cq_root = self.root / "consumequeue"
        self._cqs: dict[str, dict[int, ConsumeQueue]] = {}
        self._lock = threading.Lock()
        self._dispatchers: list[Dispatcher] = []
        self._listeners: list[Callable[[str, int, int], None]] = []
        self._dispatch_q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._needs_dispatch = False
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._running = False
        self._loaded = False
        self._last_cq_ts = 0
        self._reput_from = 0  # replication: where indexing of appended raw bytes resumes
        self._disk_full = ""  # why writes are refused ("" while the disk has room)
        if index is not None:
            self.add_dispatcher(index)

    # ------------------------------------------------------------------ lifecycle
    @property
    def abort_file(self) -> Path:
        return self.root / "abort"

    def load(self) -> bool:
        """Open files and recover; ``False`` (with the reason logged) when the data is unusable."""
        self.root.mkdir(parents=True, exist_ok=True)
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
        if last_exit_ok:
            end = self.commitlog.recover_normally(crc)
        else:
            log.warning("store %s did not exit cleanly: abnormal recovery", self.root)
            min_ts = self.checkpoint.min_timestamp(self.index is not None)
            end = self.commitlog.recover_abnormally(min_ts, crc, self._redispatch)
        cl_min = self.commitlog.get_min_offset()
        for cq in self._all_cqs():
            cq.truncate_dirty(end)
            cq.correct_min_offset(cl_min)
        # Re-dispatch what the consume queues had not indexed yet (RocketMQ's reputFromOffset).
        reput_from = max([cl_min, *(cq.max_physic_offset for cq in self._all_cqs())])
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

    def _load_consume_queues(self) -> None:
        if not self._cq_root.exists():
            return
        entries = self.options.consumequeue_entries
        for topic_dir in sorted(self._cq_root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for qdir in sorted(topic_dir.iterdir()):
                if not qdir.is_dir() or not qdir.name.lstrip("-").isdigit():
                    continue
                cq = ConsumeQueue(topic_dir.name, int(qdir.name), self._cq_root, entries)
                cq.load()
                self._cqs.setdefault(topic_dir.name, {})[int(qdir.name)] = cq

    def start(self) -> None:
        if not self._loaded:
            raise StoreError("store.start() called before a successful load()")
        self.abort_file.touch()
        self.check_disk()
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
            return
        self._running = False
        with self._lock:  # no put is half-way through once we hold it
            pass
        self._stop.set()
        self._dispatch_q.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []
        self.flush_policy.shutdown()
        self.commitlog.commit(0)
        self.commitlog.flush(0)
        self._flush_metadata(thorough=True)
        if self.index is not None:
            self.index.shutdown()
        if self.allocator is not None:
            self.allocator.shutdown()
        self.commitlog.queue.shutdown()
        for cq in self._all_cqs():
            cq.shutdown()
        self.abort_file.unlink(missing_ok=True)

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
        flushed = self.flush_policy.request(result.wrote_offset + result.wrote_bytes)

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
        topic, queue_id = msgs[0].topic, msgs[0].queue_id
        if not topic:
            return self._illegal("empty topic name")
        if queue_id < 0:
            return self._illegal(f"queue id {queue_id} is negative")
        records: list[bytearray] = []
        tags: list[int] = []
        try:
            for m in msgs:
                if m.topic != topic or m.queue_id != queue_id:
                    return self._illegal("a batch must go to one topic and queue")
                if self.options.compression != "none" and not m.sys_flag & COMPRESSED_FLAG:
                    if len(m.body) >= self.options.compression_min_size:
                        body, bits = compress_body(m.body, self.options.compression)
                        m = attrs.evolve(m, body=body, sys_flag=m.sys_flag | bits)
                records.append(encode_message(m, self.max_message_size, self.store_host))
                tags.append(_tags_code(m.properties.get(Prop.TAGS)))
        except MessageTooLargeError as exc:
            status = (
                PutStatus.PROPERTIES_SIZE_EXCEEDED if "properties" in str(exc) else PutStatus.MESSAGE_ILLEGAL
            )
            return self._illegal(str(exc), status)
        except ValueError as exc:  # a host that is not an IP address
            return self._illegal(f"cannot encode the message: {exc}")
        tran = msgs[0].sys_flag & TRANSACTION_TYPE_MASK
        # Prepared and rolled-back transaction halves are not consumable: no queue entry.
        consumable = tran not in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
        total = sum(len(r) for r in records)
        with self._lock:
            if not self._running:
                return self._illegal("the store is not running", PutStatus.SERVICE_NOT_AVAILABLE)
            try:
                cq = self._cq_for_write(topic, queue_id) if consumable else None
                mf = self.commitlog.file_for(total)
            except CommitLogFullError as exc:
                return self._illegal(str(exc))
            except OSError as exc:
                log.error("cannot create a store file: %s", exc)
                return self._illegal(
                    f"cannot create a store file: {exc}", PutStatus.CREATE_MAPPED_FILE_FAILED
                )
            queue_offset = cq.max_offset_in_queue if cq is not None else 0
            base = mf.file_from_offset + mf.wrote_position
            ts = now_ms()
            offsets: list[int] = []
            phys = base
            for i, rec in enumerate(records):
                patch_record(rec, queue_offset + i if cq is not None else 0, phys, ts)
                offsets.append(phys)
                phys += len(rec)
            start = mf.wrote_position
            try:
                mf.append(records[0] if len(records) == 1 else b"".join(records))
                if cq is not None:
                    if len(records) == 1:
                        cq.put(base, total, tags[0], queue_offset)
                    else:
                        entries = [(offsets[i], len(r), tags[i]) for i, r in enumerate(records)]
                        cq.put_many(entries, queue_offset)
            except OSError as exc:
                # A queue file could not be created: take the record back so no queue offset is
                # used twice, and report it; the store stays up.
                self.commitlog.rollback(mf, start)
                log.error("cannot write the queue entry of %s-%d: %s", topic, queue_id, exc)
                return self._illegal(
                    f"cannot create a store file: {exc}", PutStatus.CREATE_MAPPED_FILE_FAILED
                )
            mf.store_timestamp = ts
            self._reput_from = phys
            if cq is not None:
                self._last_cq_ts = ts
            if self._needs_dispatch:
                sizes = [len(r) for r in records]
                qoff = queue_offset if cq is not None else -1
                if self._dispatchers:
                    # In the lock: dispatchers see commit-log order, and a key is queryable by the
                    # time the put resolves.  Under the GIL a separate thread would only add a handoff.
                    self._dispatch_entry(msgs, offsets, sizes, tags, ts, qoff)
                if self._listeners:
                    self._dispatch_q.put((topic, queue_id, qoff + len(msgs) if qoff >= 0 else -1))
        host = self.store_host
        return PutResult(
            PutStatus.PUT_OK,
            wrote_offset=base,
            wrote_bytes=total,
            queue_offset=queue_offset,
            msg_ids=tuple(create_message_id(host, o) for o in offsets),
            store_timestamp=ts,
            message_count=len(records),
        )

    def _cq_for_write(self, topic: str, queue_id: int) -> ConsumeQueue:
        queues = self._cqs.get(topic)
        cq = queues.get(queue_id) if queues is not None else None
        if cq is None:
            cq = ConsumeQueue(topic, queue_id, self._cq_root, self.options.consumequeue_entries)
            self._cqs.setdefault(topic, {})[queue_id] = cq
        return cq

    # ------------------------------------------------------------------ dispatch
    def _dispatch_loop(self) -> None:
        """Arrival listeners run here, on the store's own thread, coalesced per queue."""
        q = self._dispatch_q
        while True:
            item = q.get()
            batch = [item]
            try:
                while len(batch) < 1024:
                    batch.append(q.get_nowait())
            except queue.Empty:
                pass
            arrived: dict[tuple[str, int], int] = {}
            stop = False
            for entry in batch:
                if entry is None:
                    stop = True
                    continue
                topic, qid, max_offset = entry
                if max_offset >= 0:
                    arrived[(topic, qid)] = max_offset
            for (topic, qid), max_offset in arrived.items():
                for listener in self._listeners:
                    try:
                        listener(topic, qid, max_offset)
                    except Exception:
                        log.exception("arrival listener %r failed", listener)
            if stop:
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

    def _redispatch_cq(self, msg: MessageExt) -> None:
        if self._consumable(msg.sys_flag):
            cq = self._cq_for_write(msg.topic, msg.queue_id)
            cq.put(msg.commit_log_offset, msg.store_size, _tags_code(msg.tags), msg.queue_offset)
            self._last_cq_ts = msg.store_timestamp

    def _redispatch(self, msg: MessageExt) -> None:
        """Rebuild the queue entry and re-index one recovered record (load time, single-threaded)."""
        self._redispatch_cq(msg)
        if self._dispatchers:
            tags = _tags_code(msg.tags)
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
        entry_check = getattr(message_filter, "matches_queue_entry", None)
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
            buffers.append(data)
            qoffsets.append(offset + (i - CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE)
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
            while pos < len(view):
                mf = self.commitlog.queue.get_last_mapped_file(start_offset + pos)
                if mf is None:
                    return False
                n = min(len(view) - pos, mf.free_space)
                mf.append(view[pos : pos + n])
                pos += n
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
                tags = _tags_code(msg.tags)
                self._dispatch_entry(
                    [msg], [offset], [msg.store_size], [tags], msg.store_timestamp, msg.queue_offset
                )
            if self._listeners and self._consumable(msg.sys_flag):
                self._dispatch_q.put((msg.topic, msg.queue_id, msg.queue_offset + 1))
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
                    (self._cq_root / t).rmdir()
                except OSError:
                    pass

    # ------------------------------------------------------------------ background service
    def _all_cqs(self) -> list[ConsumeQueue]:
        return [cq for qs in list(self._cqs.values()) for cq in list(qs.values())]

    def _service_loop(self) -> None:
        flush_every = self.options.cq_flush_interval_ms / 1000
        clean_every = self.options.clean_interval_ms / 1000
        next_flush = time.monotonic() + flush_every
        next_clean = time.monotonic() + clean_every
        while not self._stop.wait(min(flush_every, clean_every, 0.5)):
            now = time.monotonic()
            try:
                if now >= next_flush:
                    next_flush = now + flush_every
                    self._flush_metadata(thorough=True)
                if now >= next_clean:
                    next_clean = now + clean_every
                    self.clean_expired()
            except Exception:
                log.exception("store service round failed")

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
