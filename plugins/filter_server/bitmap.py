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
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from array import array
from typing import Any

import attrs

from tidemq.store import DispatchRequest

log = logging.getLogger(__name__)

# MessageSysFlag transaction types: prepared and rolled-back messages never reach a ConsumeQueue.
_TX_MASK = 0xC
_TX_PREPARED = 0x4
_TX_ROLLBACK = 0xC
_SWEEP_EVERY = 4096


@attrs.define(eq=False)
class _Registration:
    key: tuple[str, str]
    evaluate: Any  # SqlFilter.evaluate
    mask: int
    used: bool = True


@attrs.define(eq=False)
class _QueueBits:
    """Words for consecutive queue offsets starting at ``window[0]``."""

    window: tuple[int, array[int]]
    valid_from: dict[tuple[str, str], int] = attrs.field(factory=dict)


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
    ):
        if not 8 <= bits <= 64:
            raise ValueError(f"bloom bits = {bits} must be within 8..64 (one 64-bit word per entry)")
        if not 1 <= hashes <= bits // 2:
            raise ValueError(f"bloom hashes = {hashes} must be within 1..{bits // 2}")
        self.bits = bits
        self.hashes = hashes
        self.max_entries = max(1024, max_entries_per_queue)
        self.idle_expire_s = idle_expire_s
        self._regs: dict[tuple[str, str], _Registration] = {}
        self._active: dict[str, tuple[_Registration, ...]] = {}
        self._queues: dict[tuple[str, int], _QueueBits] = {}
        self._lock = threading.Lock()  # registrations only; the hot paths read without it
        self._dispatched = 0
        self._last_sweep = time.monotonic()
        #: entries skipped without reading the commit log (for the benchmark and diagnostics)
        self.skipped = 0

    # ------------------------------------------------------------------ registration
    def register(self, flt: Any, topic: str) -> _Registration:
        key = (topic, flt.expression)
        with self._lock:
            reg = self._regs.get(key)
            if reg is None:
                reg = _Registration(
                    key, flt.evaluate, bloom_mask(topic, flt.expression, self.bits, self.hashes)
                )
                self._regs[key] = reg
                self._active[topic] = (*self._active.get(topic, ()), reg)
                log.info("SQL92 pre-check registered for topic %s: %s", topic, flt.expression)
            reg.used = True
            return reg

    def _unregister(self, reg: _Registration) -> None:
        topic = reg.key[0]
        with self._lock:
            self._regs.pop(reg.key, None)
            self._active[topic] = tuple(r for r in self._active.get(topic, ()) if r is not reg)
            if not self._active[topic]:
                del self._active[topic]
            # Forget where its bits begin: if it registers again, older words lack its bits.
            for (t, _qid), q in list(self._queues.items()):
                if t == topic:
                    q.valid_from.pop(reg.key, None)
        log.info("SQL92 pre-check for topic %s unused, dropped: %s", topic, reg.key[1])

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < self.idle_expire_s:
            return
        self._last_sweep = now
        for reg in list(self._regs.values()):
            if not reg.used:
                self._unregister(reg)
            else:
                reg.used = False

    def registered(self, topic: str) -> list[str]:
        return [r.key[1] for r in self._active.get(topic, ())]

    # ------------------------------------------------------------------ dispatch (store thread)
    def dispatch(self, request: DispatchRequest) -> None:
        regs = self._active.get(request.topic)
        if not regs:
            return
        if request.sys_flag & _TX_MASK in (_TX_PREPARED, _TX_ROLLBACK):
            return
        self._dispatched += 1
        if self._dispatched % _SWEEP_EVERY == 0:
            self._sweep()
        qkey = (request.topic, request.queue_id)
        off = request.queue_offset
        q = self._queues.get(qkey)
        if q is None:
            q = self._queues[qkey] = _QueueBits((off, array("Q")))
        base, words = q.window
        if off != base + len(words):
            if base <= off < base + len(words):
                words[off - base] = self._word(regs, q, request, off)  # re-dispatch of a known entry
                return
            # A gap (restart, replication catch-up): start a new window; older entries are unknown.
            q.window = (base, words) = (off, array("Q"))
            q.valid_from.clear()
        words.append(self._word(regs, q, request, off))
        if len(words) > self.max_entries:
            keep = self.max_entries // 2
            q.window = (base + len(words) - keep, words[-keep:])

    def _word(
        self, regs: tuple[_Registration, ...], q: _QueueBits, request: DispatchRequest, off: int
    ) -> int:
        props = request.properties
        word = 0
        valid = q.valid_from
        for reg in regs:
            if reg.key not in valid:
                valid[reg.key] = off
            if reg.evaluate(props):
                word |= reg.mask
        return word

    # ------------------------------------------------------------------ pre-check (pull path)
    def maybe_matches(self, flt: Any, topic: str, queue_id: int, queue_offset: int) -> bool:
        """``False`` only when the entry's word proves ``flt`` was not true for the message."""
        reg = self._regs.get((topic, flt.expression))
        if reg is None:
            self.register(flt, topic)
            return True
        reg.used = True
        q = self._queues.get((topic, queue_id))
        if q is None:
            return True
        start = q.valid_from.get(reg.key)
        if start is None or queue_offset < start:
            return True
        base, words = q.window
        i = queue_offset - base
        if i < 0 or i >= len(words):
            return True
        mask = reg.mask
        if words[i] & mask == mask:
            return True
        self.skipped += 1
        return False
