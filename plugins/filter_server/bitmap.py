"""The SQL92 pre-check written at dispatch time (RocketMQ's ConsumeQueueExt + CommitLogDispatcherCalcBitMap).

RocketMQ evaluates every registered SQL92 consumer filter of a topic when a message is dispatched
and stores, next to the ConsumeQueue entry, a bloom-filter bit map of the filters that matched.
A pull then tests its own filter's bits on the queue entry and skips the message without reading
it from the commit log when a bit is missing.  This module does the same:

* a filter registers itself for a topic the first time a pull of that topic asks
  :meth:`FilterBitMap.maybe_matches` (RocketMQ registers on heartbeat; the broker's filter role
  only sees pulls, and the effect is the same: messages dispatched from then on get bits);
* each registered ``(topic, expression)`` owns ``hashes`` bit positions in a ``bits``-wide word
  (a bloom filter over the registered expressions, so two groups with the same expression share
  bits and many expressions only cost false positives, never misses);
* every dispatched message of a topic with registered filters gets one word per queue offset, kept
  in memory per ``(topic, queue)``; entries written before a filter registered, dropped by the
  per-queue cap, or written before a restart have no word for it and are checked the normal way.

A missing bit proves the expression was not true for the message, so skipping is exact; a set bit
only says "maybe" and the message is still checked on its properties.

Dispatch runs inside the store's append lock, so it only queues the request (a deque append); a
worker thread of the bit map evaluates the registered filters and appends the words.  An entry
whose word is not computed yet is past the end of its window and answers "maybe", as does every
entry when the queue of pending requests is over ``max_pending`` (the request is dropped and the
worker starts a new window after the gap).  Registrations are bounded per topic and in all: a filter
beyond the bounds gets no pre-check, it is evaluated at read time like any other, so correctness
never depends on the bit map.  A registration no pull used for ``idle_expire_s`` is dropped by the
worker, traffic or not.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from tidemq.store import DispatchedPut, DispatchRequest
from tidemq.threads import name_this_thread

log = logging.getLogger(__name__)

# MessageSysFlag transaction types: prepared and rolled-back messages never reach a ConsumeQueue.
_TX_MASK = 0xC
_TX_PREPARED = 0x4
_TX_ROLLBACK = 0xC
_ALL_ONES = (1 << 64) - 1  # a word that says "maybe" to every registration
_YIELD_EVERY_S = 0.001  # the worker gives up the GIL this often, so the event loop never waits on it


@attrs.define(eq=False)
class _Registration:
    key: tuple[str, str]
    evaluate: Any  # SqlFilter.evaluate
    mask: int
    last_used: float
    #: set (before it leaves ``_active``) when dropped: words computed later lack its bits
    dead: bool = False


@attrs.define(eq=False)
class _QueueBits:
    """Words for consecutive queue offsets starting at ``window[0]`` (written by the worker only)."""

    window: tuple[int, array[int]]
    #: first offset whose word has each registration's bits (keyed by the object, not the
    #: expression: a registration dropped and made again starts over)
    valid_from: dict[_Registration, int] = attrs.field(factory=dict)


def bloom_mask(topic: str, expression: str, bits: int, hashes: int) -> int:
    """The ``hashes`` bit positions of one registration, as a mask."""
    digest = hashlib.blake2b(f"{topic}#{expression}".encode(), digest_size=16).digest()
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little") | 1
    mask = 0
    for i in range(hashes):
        mask |= 1 << ((h1 + i * h2) % bits)
    return mask


class FilterBitMap:
    """A store dispatcher computing per-entry bloom words for registered SQL92 filters."""

    def __init__(
        self,
        *,
        bits: int = 64,
        hashes: int = 3,
        max_entries_per_queue: int = 1 << 22,
        idle_expire_s: float = 3600.0,
        max_registrations_per_topic: int = 32,
        max_registrations: int = 1024,
        max_pending: int = 16384,
    ):
        if not 8 <= bits <= 64:
            raise ValueError(f"bloom bits = {bits} must be within 8..64 (one 64-bit word per entry)")
        if not 1 <= hashes <= bits // 2:
            raise ValueError(f"bloom hashes = {hashes} must be within 1..{bits // 2}")
        if not 0 < idle_expire_s <= 7 * 86400:
            raise ValueError(f"idle_expire_s = {idle_expire_s} must be within 0..604800 (a week), above 0")
        if not 1 <= max_registrations_per_topic <= 4096:
            raise ValueError(
                f"max_registrations_per_topic = {max_registrations_per_topic} must be within 1..4096"
            )
        if not 1 <= max_registrations <= 65536:
            raise ValueError(f"max_registrations = {max_registrations} must be within 1..65536")
        if max_pending < 1:
            raise ValueError(f"max_pending = {max_pending} must be at least 1")
        self.bits = bits
        self.hashes = hashes
        self.max_entries = max(1024, max_entries_per_queue)
        self.idle_expire_s = idle_expire_s
        self.max_per_topic = max_registrations_per_topic
        self.max_registrations = max_registrations
        self.max_pending = max_pending
        self._regs: dict[tuple[str, str], _Registration] = {}
        self._active: dict[str, tuple[_Registration, ...]] = {}
        self._queues: dict[tuple[str, int], _QueueBits] = {}
        self._lock = threading.Lock()  # registrations and the worker's start / exit
        self._pending: collections.deque[DispatchRequest] = collections.deque()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self._busy = False
        self._closed = False
        #: entries skipped without reading the commit log (for the benchmark and diagnostics)
        self.skipped = 0
        #: dispatched entries left without a word because ``max_pending`` were waiting
        self.dropped = 0
        #: registrations refused by the bounds (those filters simply get no pre-check)
        self.refused = 0

    # ------------------------------------------------------------------ registration
    def _full(self, topic: str) -> bool:
        return (
            len(self._regs) >= self.max_registrations
            or len(self._active.get(topic, ())) >= self.max_per_topic
        )

    def register(self, flt: Any, topic: str) -> _Registration | None:
        """Register ``flt`` for ``topic``; ``None`` when the bounds are reached (no pre-check)."""
        key = (topic, flt.expression)
        now = time.monotonic()
        with self._lock:
            reg = self._regs.get(key)
            if reg is None:
                if self._closed or self._full(topic):
                    self.refused += 1
                    return None
                reg = _Registration(
                    key, flt.evaluate, bloom_mask(topic, flt.expression, self.bits, self.hashes), now
                )
                self._regs[key] = reg
                self._active[topic] = (*self._active.get(topic, ()), reg)
                log.info("SQL92 pre-check registered for topic %s: %s", topic, flt.expression[:200])
                if self._worker is None:
                    self._worker = threading.Thread(target=self._run, name="sql92-bitmap", daemon=True)
                    self._worker.start()
            reg.last_used = now
            return reg

    def registered(self, topic: str) -> list[str]:
        return [r.key[1] for r in self._active.get(topic, ())]

    def _expire(self, now: float) -> None:
        """Drop registrations no pull used for ``idle_expire_s`` (worker thread)."""
        with self._lock:
            idle = [r for r in self._regs.values() if now - r.last_used > self.idle_expire_s]
            for reg in idle:
                reg.dead = True  # first: a reader that still holds it must stop trusting words
                del self._regs[reg.key]
                topic = reg.key[0]
                left = tuple(r for r in self._active.get(topic, ()) if r is not reg)
                if left:
                    self._active[topic] = left
                else:
                    self._active.pop(topic, None)
        for reg in idle:
            log.info("SQL92 pre-check for topic %s unused, dropped: %s", reg.key[0], reg.key[1][:200])
        if idle:
            for qkey, q in list(self._queues.items()):
                if qkey[0] not in self._active:
                    del self._queues[qkey]
                else:
                    for reg in [r for r in q.valid_from if r.dead]:
                        del q.valid_from[reg]

    # ------------------------------------------------------------------ dispatch (store thread, under its lock)
    def dispatch(self, request: DispatchRequest) -> None:
        """Queue the entry for the worker: no filter is evaluated here, under the store's lock."""
        if request.topic not in self._active:
            return
        if request.sys_flag & _TX_MASK in (_TX_PREPARED, _TX_ROLLBACK):
            return
        if len(self._pending) >= self.max_pending:
            # The worker is behind: this entry gets no word (the gap starts a new window: "maybe").
            self.dropped += 1
            return
        self._pending.append(request)
        if not self._wake.is_set():
            self._wake.set()

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
        """One put at once (a BatchDispatcher): nothing at all for a topic no SQL92 filter
        watches (the usual put), else the same per-entry requests as :meth:`dispatch`."""
        if topic not in self._active:
            return
        for i, offset in enumerate(commit_log_offsets):
            self.dispatch(
                DispatchRequest(
                    topic=topic,
                    queue_id=queue_id,
                    commit_log_offset=offset,
                    msg_size=sizes[i],
                    tags_code=tags_codes[i],
                    store_timestamp=store_timestamp,
                    queue_offset=queue_offset + i if queue_offset >= 0 else 0,
                    sys_flag=sys_flags[i],
                    properties=dict(properties[i]),
                )
            )

    def dispatch_groups(self, puts: Sequence[DispatchedPut]) -> None:
        """A store call's puts at once (a GroupDispatcher): :meth:`dispatch_batch` for each put
        of a topic a SQL92 filter watches, nothing for the others (issue 38, groupdispatch)."""
        active = self._active
        if not active:  # no SQL92 filter registered: the usual broker
            return
        for put in puts:
            if put[0] in active:
                self.dispatch_batch(*put)

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        name_this_thread()
        sweep_every = min(self.idle_expire_s / 4, 60.0)
        next_sweep = time.monotonic() + sweep_every
        while not self._closed:
            self._wake.wait(max(0.0, next_sweep - time.monotonic()))
            self._wake.clear()
            yield_at = time.perf_counter() + _YIELD_EVERY_S
            pending = self._pending
            while pending and not self._closed:
                self._busy = True
                try:
                    self._compute(pending.popleft())
                except Exception:  # a bug here must not stop the worker: entries stay "maybe"
                    log.exception("SQL92 pre-check failed to compute an entry")
                finally:
                    self._busy = False
                if time.perf_counter() >= yield_at:
                    time.sleep(0)  # let the event loop and the store take the GIL
                    yield_at = time.perf_counter() + _YIELD_EVERY_S
            now = time.monotonic()
            if now >= next_sweep:
                self._expire(now)
                next_sweep = now + sweep_every
            with self._lock:
                if self._closed or (not self._regs and not pending):
                    self._worker = None
                    self._queues.clear()
                    return

    def _compute(self, request: DispatchRequest) -> None:
        regs = self._active.get(request.topic)
        if not regs:
            return
        qkey = (request.topic, request.queue_id)
        off = request.queue_offset
        q = self._queues.get(qkey)
        if q is None:
            q = self._queues[qkey] = _QueueBits((off, array("Q")))
        base, words = q.window
        end = base + len(words)
        if off != end:
            if base <= off < end:
                words[off - base] = _ALL_ONES  # re-dispatch of a known entry: "maybe" for all
                return
            # A gap (dropped entries, restart, replication catch-up): start a new window; the
            # older entries are unknown.
            q.valid_from.clear()
            q.window = (base, words) = (off, array("Q"))
        props = request.properties
        word = 0
        valid = q.valid_from
        for reg in regs:
            if reg not in valid:
                valid[reg] = off
            if reg.evaluate(props):
                word |= reg.mask
        words.append(word)
        if len(words) > self.max_entries:
            keep = self.max_entries // 2
            q.window = (base + len(words) - keep, words[-keep:])

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued entry is computed (tests, benchmarks); ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while self._pending or self._busy:
            if time.monotonic() > deadline or (self._worker is None and self._pending):
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        """Stop the worker; the bit map answers "maybe" from then on."""
        with self._lock:
            self._closed = True
            worker = self._worker
        self._wake.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join(5.0)

    # ------------------------------------------------------------------ pre-check (pull path)
    def maybe_matches(self, flt: Any, topic: str, queue_id: int, queue_offset: int) -> bool:
        """``False`` only when the entry's word proves ``flt`` was not true for the message."""
        reg = self._regs.get((topic, flt.expression))
        if reg is None:
            if not self._full(topic):
                self.register(flt, topic)
            return True
        reg.last_used = time.monotonic()
        q = self._queues.get((topic, queue_id))
        if q is None:
            return True
        start = q.valid_from.get(reg)
        if start is None or queue_offset < start:
            return True
        base, words = q.window
        i = queue_offset - base
        if i < 0 or i >= len(words):
            return True
        mask = reg.mask
        if words[i] & mask == mask or reg.dead:  # dead: the word may come after it was dropped
            return True
        self.skipped += 1
        return False
