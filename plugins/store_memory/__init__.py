"""tidemq_store_memory: the ``memory`` store, for tests and ephemeral brokers.

Same records, queue offsets, statuses and ``next_begin_offset`` rules as the ``mmap`` store (both
pass :mod:`tidemq.testing.store_contract`), kept in process memory: nothing survives a restart.
``max_bytes`` bounds the memory used by dropping the oldest records, which then read as
OFFSET_TOO_SMALL like messages cleaned from disk.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import attrs

from tidemq import hookimpl
from tidemq.address import split_address
from tidemq.config import parse_options
from tidemq.errors import ConfigError, CorruptDataError, MessageTooLargeError
from tidemq.filter import MessageFilter, queue_entry_check
from tidemq.flush import FlushStatistics
from tidemq.futures import StoreFuture
from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    RecordEncoder,
    decode_message,
)
from tidemq.plugins import PluginContext, Register
from tidemq.store import (
    ArrivalNotifier,
    Dispatcher,
    GetResult,
    GetStatus,
    PutResult,
    PutStatus,
    check_queue_offset,
    dispatch_messages,
)

log = logging.getLogger(__name__)

#: Queue entries scanned per pull at most, as the mmap store (16000 bytes of 20-byte entries).
MAX_FILTER_ENTRIES = 800


@attrs.define
class MemoryStoreOptions:
    """``[store.memory]``."""

    #: Keep at most this many bytes of records (0: unbounded); the oldest go first.
    max_bytes: int = 0
    #: Largest body accepted; 0 takes the broker's ``max_message_size``.
    max_message_size: int = 0
    #: ``ip:port`` written as STOREHOSTADDRESS and into msgIds.
    store_host: str = "127.0.0.1:10911"


@attrs.define
class _Queue:
    base: int = 0  # queue offset of entries[0]
    entries: list[tuple[int, int, int]] = attrs.field(factory=list)  # (phys, size, tags code)
    min_offset: int = 0

    @property
    def max_offset(self) -> int:
        return self.base + len(self.entries)


class MemoryMessageStore:
    """A :class:`tidemq.store.MessageStore` in memory."""

    def __init__(
        self, options: MemoryStoreOptions, settings: dict[str, Any] | None = None, index: Any | None = None
    ):
        settings = dict(settings or {})
        self.index = index
        self.options = options
        self.max_message_size = options.max_message_size or int(
            settings.get("max_message_size", 4 * 1024 * 1024)
        )
        try:
            self.store_host = split_address(options.store_host, default_port=0)
        except ValueError as exc:
            raise ConfigError(
                f"[store.memory] store_host = {options.store_host!r} is not ip:port ({exc})"
            ) from None
        self._lock = threading.Lock()
        self._offsets: list[int] = []  # commit-log offsets in order
        self._records: dict[int, bytes] = {}
        self._start = 0  # index into _offsets of the oldest record kept
        self._phys_end = 0
        self._bytes = 0
        self._queues: dict[str, dict[int, _Queue]] = {}
        self._dispatchers: list[Dispatcher] = []
        # Arrival listeners run on the notifier's thread, coalesced per queue (as the mmap store).
        self._notifier = ArrivalNotifier(self._lock, "memory-store-dispatch")
        self._listeners = self._notifier.listeners
        self._running = False
        if index is not None:
            self.add_dispatcher(index)

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> bool:
        if self.index is not None:
            # Nothing survives a restart here, so the index starts from a clean slate too.
            self.index.load(True, 0)
        return True

    def start(self) -> None:
        self._running = True
        self._notifier.start()

    def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        self._notifier.stop()
        if self.index is not None:
            self.index.flush()
            self.index.shutdown()

    def add_dispatcher(self, dispatcher: Dispatcher) -> None:
        self._dispatchers.append(dispatcher)

    def add_arrival_listener(
        self,
        listener: Callable[[str, int, int], None],
        interested: Callable[[str, int], bool] | None = None,
    ) -> None:
        self._notifier.add_listener(listener, interested)

    @property
    def store_host(self) -> tuple[str, int]:
        """STOREHOSTADDRESS of new records (the broker sets it once its port is bound)."""
        return self._store_host

    @store_host.setter
    def store_host(self, host: tuple[str, int]) -> None:
        self._encoder = RecordEncoder(host, self.max_message_size)
        self._store_host = host

    # ------------------------------------------------------------------ writes
    def put_message(self, msg: MessageInner) -> Future[PutResult]:
        return self.put_messages((msg,))

    def put_messages(self, msgs: Sequence[MessageInner]) -> Future[PutResult]:
        fut: Future[PutResult] = StoreFuture()
        fut.set_result(self._append(msgs))
        return fut

    def _append(self, msgs: Sequence[MessageInner]) -> PutResult:
        if not self._running:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error="the store is not running")
        if not msgs:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, error="empty message batch")
        topic, queue_id = msgs[0].topic, msgs[0].queue_id
        if not topic or queue_id < 0:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, error=f"bad topic {topic!r} or queue id {queue_id}")
        for m in msgs:
            if m.topic != topic or m.queue_id != queue_id:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, error="a batch must go to one topic and queue")
        try:
            batch = self._encoder.prepare(msgs)
        except MessageTooLargeError as exc:
            status = (
                PutStatus.PROPERTIES_SIZE_EXCEEDED if "properties" in str(exc) else PutStatus.MESSAGE_ILLEGAL
            )
            return PutResult(status, error=str(exc))
        except ValueError as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, error=f"cannot encode the message: {exc}")
        tags = batch.tags_codes
        sizes = batch.sizes
        consumable = msgs[0].sys_flag & TRANSACTION_TYPE_MASK not in (
            TRANSACTION_PREPARED_TYPE,
            TRANSACTION_ROLLBACK_TYPE,
        )
        with self._lock:
            q = self._queues.setdefault(topic, {}).setdefault(queue_id, _Queue()) if consumable else None
            qoff = q.max_offset if q is not None else 0
            ts = time.time_ns() // 1_000_000
            base = self._phys_end
            buf = bytearray(batch.total)
            try:
                offsets = self._encoder.write_into(buf, 0, batch, qoff, base, ts, 1 if q is not None else 0)
            except (struct.error, TypeError, OverflowError) as exc:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, error=f"cannot encode the message: {exc}")
            pos = 0
            for i, phys in enumerate(offsets):
                size = sizes[i]
                self._records[phys] = bytes(buf[pos : pos + size])
                self._offsets.append(phys)
                if q is not None:
                    q.entries.append((phys, size, tags[i]))
                pos += size
            self._bytes += batch.total
            self._phys_end = base + batch.total
            self._evict()
            if self._dispatchers:
                # In the lock: commit-log order.  One call per put; a batch dispatcher (the hash
                # index) only queues the keys, and its queries index what is queued first, so a
                # key is found once the put resolves.
                dispatch_messages(
                    self._dispatchers, msgs, offsets, sizes, tags, ts, qoff if q is not None else -1
                )
            if self._listeners and q is not None:
                self._notifier.arrived(topic, queue_id, qoff + len(msgs))
        return PutResult(
            PutStatus.PUT_OK,
            wrote_offset=base,
            wrote_bytes=batch.total,
            queue_offset=qoff,
            msg_ids=self._encoder.message_ids(offsets),
            store_timestamp=ts,
            message_count=len(offsets),
        )

    def _evict(self) -> None:
        limit = self.options.max_bytes
        if not limit:
            return
        while self._bytes > limit and self._start < len(self._offsets) - 1:
            phys = self._offsets[self._start]
            self._bytes -= len(self._records.pop(phys))
            self._start += 1
        if self._start > 4096:  # compact the offset list now and then
            del self._offsets[: self._start]
            self._start = 0
        min_phys = self._offsets[self._start]
        for qs in self._queues.values():
            for q in qs.values():
                drop = 0
                while drop < len(q.entries) and q.entries[drop][0] < min_phys:
                    drop += 1
                if drop:
                    del q.entries[:drop]
                    q.base += drop
                q.min_offset = q.base

    # ------------------------------------------------------------------ reads
    def _queue(self, topic: str, queue_id: int) -> _Queue | None:
        qs = self._queues.get(topic)
        return qs.get(queue_id) if qs is not None else None

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
        q = self._queue(topic, queue_id)
        if q is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        with self._lock:
            base, entries, min_offset = q.base, q.entries[:], q.min_offset
        max_offset = base + len(entries)
        outside = check_queue_offset(offset, min_offset, max_offset)
        if outside is not None:
            return outside
        status = GetStatus.NO_MATCHED_MESSAGE
        buffers: list[bytes] = []
        qoffsets: list[int] = []
        total = 0
        limit = max(MAX_FILTER_ENTRIES, max_count)
        idx = offset - base
        end = min(len(entries), idx + limit)
        entry_check = queue_entry_check(message_filter)
        while idx < end:
            phys, size, tags_code = entries[idx]
            if buffers and (len(buffers) >= max_count or total + size > max_bytes):
                break
            idx += 1
            if message_filter is not None and not message_filter.matches_tags_code(tags_code):
                continue
            # Optional MessageFilter.matches_queue_entry (filter_server's dispatch-time bit map).
            if entry_check is not None and not entry_check(topic, queue_id, base + idx - 1):
                continue
            data = self._records.get(phys)
            if data is None:
                if not buffers:
                    status = GetStatus.MESSAGE_WAS_REMOVING
                continue
            if message_filter is not None:
                try:
                    props = decode_message(data, with_body=False).properties
                except CorruptDataError:
                    continue
                if not message_filter.matches_message(props):
                    continue
            buffers.append(data)
            qoffsets.append(base + idx - 1)
            total += size
            status = GetStatus.FOUND
        return GetResult(status, base + idx, min_offset, max_offset, tuple(buffers), tuple(qoffsets))

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        q = self._queue(topic, queue_id)
        return q.max_offset if q is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        q = self._queue(topic, queue_id)
        return q.min_offset if q is not None else 0

    def _entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        q = self._queue(topic, queue_id)
        if q is None:
            return None
        with self._lock:
            if not q.min_offset <= offset < q.max_offset:
                return None
            return q.entries[offset - q.base]

    def get_commit_log_offset(self, topic: str, queue_id: int, offset: int) -> int:
        e = self._entry(topic, queue_id, offset)
        return e[0] if e is not None else -1

    def get_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        e = self._entry(topic, queue_id, offset)
        data = self._records.get(e[0]) if e is not None else None
        return decode_message(data, with_body=False).store_timestamp if data is not None else -1

    def get_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        q = self._queue(topic, queue_id)
        if q is None:
            return 0
        lo, hi = q.min_offset, q.max_offset

        def key(i: int) -> int:
            ts = self.get_store_time(topic, queue_id, i)
            return timestamp_ms if ts < 0 else ts

        return bisect.bisect_left(range(lo, hi), timestamp_ms, key=key) + lo

    def look_message_by_offset(self, commit_log_offset: int, size: int = -1) -> bytes | None:
        return self._records.get(commit_log_offset)

    def get_max_phy_offset(self) -> int:
        return self._phys_end

    def get_min_phy_offset(self) -> int:
        with self._lock:
            return self._offsets[self._start] if self._start < len(self._offsets) else self._phys_end

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(qs) for t, qs in list(self._queues.items()) if qs}

    def delete_topics(self, topics: Sequence[str]) -> None:
        with self._lock:
            for t in topics:
                self._queues.pop(t, None)

    # ------------------------------------------------------------------ StoreIntrospection
    def dispatched_offset(self) -> int:
        """Records are in their queues once put: dispatch is never behind."""
        return self._phys_end

    def flushed_offset(self) -> int:
        """Nothing is ever written to disk; nothing waits for a flush either."""
        return self._phys_end

    def queue_entry(self, topic: str, queue_id: int, index: int) -> tuple[int, int, int] | None:
        return self._entry(topic, queue_id, index)

    def clean_expired_queues(self) -> int:
        """Queues keep their offsets when old records are evicted (as files would): none to drop."""
        return 0

    def flush_statistics(self) -> FlushStatistics | None:
        return None


def create(ctx: PluginContext) -> MemoryMessageStore:
    options = parse_options(MemoryStoreOptions, ctx.options, "[store.memory]")
    return MemoryMessageStore(options, dict(ctx.settings), ctx.components.get("index"))


@hookimpl
def tidemq_register_stores(register: Register) -> None:
    register.add(
        "memory", create, "in-memory store for tests and ephemeral brokers (nothing survives a restart)"
    )
