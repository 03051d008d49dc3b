"""The duplicate window (issue 37): a resend of a stored message is answered, not stored again.

RocketMQ clients give every message a unique id (the ``UNIQ_KEY`` property; RocketMQ 5's
``message_id``) and send it again, unchanged, when an answer is lost or late.  The window keeps,
per topic and for ``dedup_window_s`` seconds, each stored message's key with the answer its send
got (message id, queue id, queue offset, and the commit-log end of its put).  A send whose key is
in the window is not stored: it is answered as the first send was (a batch: each message's id,
the first one's offset).  A resend that arrives while the first copy is still being stored waits
for that copy's put (:class:`Duplicate`).

The small typed API a send path calls (SendService.prepare today, the compiled send lane later):

* :meth:`DuplicateWindow.topic_window` -- seconds a topic's keys are kept (0: no window);
* :meth:`DuplicateWindow.check` -- ``check(topic, key)``: the :class:`Sent` that first stored
  ``key`` (answered, or still pending: :attr:`Sent.send` is not None), or None;
* :meth:`DuplicateWindow.admit_run` -- a run of prepared sends (the compiled send lane's): checks
  and records them in one compiled call, or declines the run (a resend) for the handler;
* :meth:`DuplicateWindow.record` -- a send about to be stored: its keys point at it (pending);
  :meth:`Sent.stored` (called by the put's outcome) turns it into the answer, or forgets the
  keys when nothing was stored, so a retry stores the message.

Memory: bounded by ``dedup_max_entries`` keys and ``dedup_max_bytes`` (keys' lengths plus a
measured per-key and per-send overhead), the oldest send evicted first.  Durability: the window is
derived from the commit log, rebuilt at start and when the broker becomes master
(:mod:`tidemq.broker.dedup_rebuild`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tidemq.broker import dedup_table
from tidemq.broker.dedup_keys import (
    KEY_ATTRIBUTE,
    MAX_KEY_LENGTH,
    PER_KEY_BYTES,
    PER_SEND_BYTES,
    TOPIC_ATTRIBUTE,
    UNIQ_KEY,
    content_key,
    not_windowed,
    parse_key_kind,
    parse_window,
    topic_attribute,
)
from tidemq.broker.dedup_sent import Duplicate, Sent
from tidemq.broker.dedup_table import HashTable, WindowFields, batch_keys, hashes_of, key_hash
from tidemq.errors import TidemqError
from tidemq.message import body_crc, decode_message_id

if TYPE_CHECKING:
    from tidemq.broker.services.put import Send
    from tidemq.store import MessageStore

log = logging.getLogger(__name__)

__all__ = [
    "KEY_ATTRIBUTE",
    "MAX_KEY_LENGTH",
    "PER_KEY_BYTES",
    "PER_SEND_BYTES",
    "REBUILD_WAIT_S",
    "TOPIC_ATTRIBUTE",
    "UNIQ_KEY",
    "Duplicate",
    "DuplicateWindow",
    "Sent",
    "WindowRebuilding",
    "content_key",
    "parse_key_kind",
    "parse_window",
]


#: How long a send waits for the window's rebuild after a promotion (a new epoch) before it is
#: answered SERVICE_NOT_AVAILABLE, which RocketMQ 4.x producers send again at once (as
#: SYSTEM_ERROR; SYSTEM_BUSY they do not).  Under a client's default 3 s send timeout, so the
#: client's own retries get their turn; a window of 1 M keys takes 5-8 s to rebuild.
REBUILD_WAIT_S = 2.5


class WindowRebuilding(TidemqError):
    """The window is being rebuilt (a promotion): it cannot say yet whether a send is a resend.
    Raised by :meth:`DuplicateWindow.check` to a caller that did not wait
    (:meth:`DuplicateWindow.serving`, :meth:`DuplicateWindow.wait_rebuilt`)."""


class DuplicateWindow(WindowFields):
    """Per topic, each stored message's UNIQ_KEY with the :class:`Sent` that stored it.

    Its counters, tables and settings are :class:`~tidemq.broker.dedup_table.WindowFields`'s
    (compiled when built): :meth:`admit_run`, the send lane's call per run, is the base's, one
    compiled call that checks, records, counts and trims; :meth:`admit_run_py` is its reference."""

    def __init__(
        self,
        window_s: float,
        max_entries: int,
        max_bytes: int,
        *,
        content: bool = False,
        clock: Callable[[], float] = time.monotonic,
        owner: DuplicateWindow | None = None,
    ) -> None:
        #: The window its Sents belong to: itself, or the live window a scratch one is rebuilt for.
        self._owner = owner if owner is not None else self
        self.window_s = float(window_s)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._topics: dict[str, HashTable] = {}
        self._order: collections.deque[Sent] = collections.deque()
        #: (topic config object, its window): the attribute is read once per config object.
        self._topic_windows: dict[str, tuple[object, float, bool]] = {}
        #: Resends keyed on content (``dedup_key = "content"``) rather than on UNIQ_KEY.
        self.content = content
        #: Keys and (estimated) bytes held now.
        self.entries = 0
        self.nbytes = 0
        #: Messages answered from the window instead of being stored, per topic (since start).
        self.dropped: dict[str, int] = {}
        #: Sends evicted before their time to keep the bounds, and sends not kept (too many keys).
        self.evicted = 0
        #: The last rebuild: records read, keys kept, seconds taken.
        self.rebuilt_records = 0
        self.rebuilt_keys = 0
        self.rebuild_seconds = 0.0
        #: Controller mode: the epoch the window was built for; a new one rebuilds it first.
        self.epoch_source: Callable[[], int] | None = None
        #: ``fill(window)``: rebuild ``window`` from the commit log (set by ``attach_window``).
        self.fill: Callable[[DuplicateWindow], None] | None = None
        self._built_epoch: int | None = None
        #: The rebuild running in a thread after a promotion (None: none runs), and its number.
        self._rebuilding: asyncio.Future[None] | None = None
        self._generation = 0
        #: The compiled run check (None: the Python reference), on compiled tables only.
        self._compiled_run = dedup_table.admit_run if HashTable is dedup_table.CompiledHashTable else None
        self._compiled_trim = dedup_table.trim if self._compiled_run is not None else None
        self.configure_run(Sent, PER_KEY_BYTES, PER_SEND_BYTES, UNIQ_KEY, MAX_KEY_LENGTH)

    # ------------------------------------------------------------------ settings
    def topic_window(self, topic: str, cfg: object) -> float:
        """Seconds ``topic``'s keys are kept: its ``dedup.window.seconds`` attribute, else
        ``dedup_window_s``; 0 for retry and dead-letter topics (redeliveries on purpose)."""
        return self.topic_settings(topic, cfg)[0]

    def topic_settings(self, topic: str, cfg: object) -> tuple[float, bool]:
        """(seconds ``topic``'s keys are kept, whether its key is the content): its attributes
        ``dedup.window.seconds`` and ``dedup.key``, else ``dedup_window_s`` and ``dedup_key``.
        Read once per topic config object (a changed config is a new object)."""
        cached = self._topic_windows.get(topic)
        if cached is not None and cached[0] is cfg:
            return cached[1], cached[2]
        seconds = self.window_s
        content = self.content
        if not_windowed(topic):
            seconds = 0.0
        else:
            attributes = getattr(cfg, "attributes", None)
            if isinstance(attributes, Mapping):
                value = topic_attribute(attributes, TOPIC_ATTRIBUTE)
                if value is not None:
                    seconds = parse_window(value, self.window_s, topic)
                kind = topic_attribute(attributes, KEY_ATTRIBUTE)
                if kind is not None:
                    content = parse_key_kind(kind, content, topic)
        if len(self._topic_windows) > 65536:
            self._topic_windows.clear()
        self._topic_windows[topic] = (cfg, seconds, content)
        return seconds, content

    # ------------------------------------------------------------------ the API of a send path
    def check(self, topic: str, key: str) -> Sent | None:
        """The send that stored ``key`` in ``topic`` within the window (answered, or pending:
        its ``send`` is set), or None; :class:`WindowRebuilding` while a rebuild runs."""
        if self.epoch_source is not None:
            self._follow_epoch()
        if self._rebuilding is not None:
            raise WindowRebuilding("the duplicate window is being rebuilt after a promotion; send again")
        table = self._topics.get(topic)
        if table is None:
            return None
        sent = table.get(key_hash(key))
        if sent is None or sent.deadline <= self._clock():
            return None
        return sent

    def check_many(self, topic: str, hashes: array[int]) -> list[Sent | None] | None:
        """:meth:`check` of each key of a batch, given as :func:`hashes_of` its keys, or None
        when no key is in the table at all: the common case, found in one pass in C."""
        if self.epoch_source is not None:
            self._follow_epoch()
        if self._rebuilding is not None:
            raise WindowRebuilding("the duplicate window is being rebuilt after a promotion; send again")
        table = self._topics.get(topic)
        if table is None:
            return None
        if not table.any_of(hashes):
            return None
        now = self._clock()
        hits: list[Sent | None] = []
        for h in hashes:
            sent = table.get(h)
            hits.append(sent if sent is not None and sent.deadline > now else None)
        return hits

    def record(self, topic: str, hashes: array[int], send: Send | None, window_s: float) -> Sent | None:
        """``send``'s messages, about to be stored, under their keys (``hashes``:
        :func:`hashes_of` them), pending until :meth:`Sent.stored`; None when the send is too
        large for the window."""
        n = len(hashes)
        if n > self.max_entries:
            self.evicted += 1
            return None
        now = self._clock()
        sent = Sent(self, topic, hashes, now + window_s, send)
        self._add(sent, hashes, now)
        return sent

    def admit_run_py(self, sends: Sequence[Send], config_of: Callable[[str], object], now: float) -> bool:
        """:meth:`admit_run`'s Python reference (the compiled one gives the same verdicts and
        records: tests/test_dedup_run.py)."""
        planned: list[tuple[Send, str, array[int], float]] = []
        seen: set[tuple[str, int]] = set()
        for send in sends:
            msgs = send.msgs
            if not msgs:
                continue
            topic = msgs[0].topic
            seconds, content = self.topic_settings(topic, config_of(topic))
            if seconds <= 0:
                continue
            if content:
                digests = [content_key(m.flag, m.body, m.properties) for m in msgs]
                if len(set(digests)) != len(digests):
                    continue  # twice the same content in one batch: stored as it is
                hashes = hashes_of(digests)
            else:
                found = batch_keys(msgs, UNIQ_KEY, MAX_KEY_LENGTH)
                if found is None:
                    continue  # a message without a usable key: stored as it is
                hashes = found[1]
            for h in hashes:
                if (topic, h) in seen:
                    return False  # a key twice in the run: the handler refuses or makes it wait
                seen.add((topic, h))
            held = self._topics.get(topic)
            if held is not None:
                for h in hashes:
                    sent = held.get(h)
                    if sent is not None and sent.deadline > now:
                        return False  # a resend the window holds: the handler answers it
            planned.append((send, topic, hashes, seconds))
        keys = recorded = replaced = too_large = 0
        for send, topic, hashes, seconds in planned:
            n = len(hashes)
            if n > self.max_entries:
                too_large += 1
                continue
            table = self._topics.get(topic)
            if table is None:
                table = self._topics[topic] = HashTable()
            sent = Sent(self, topic, hashes, now + seconds, send)
            taken = table.put_record(hashes, sent)  # (what ``put`` of each key replaced)
            if taken is not None:
                replaced += len(taken)
            sent.nbytes = n * PER_KEY_BYTES + PER_SEND_BYTES
            self._order.append(sent)
            send.dedup = sent
            keys += n
            recorded += 1
        self._recorded(keys, recorded, replaced, too_large, now)
        return True

    def _recorded(self, keys: int, recorded: int, replaced: int, too_large: int, now: float) -> None:
        """Counts a run's records (``replaced``: older keys they took over), then trims."""
        self.entries += keys - replaced
        self.nbytes += keys * PER_KEY_BYTES + recorded * PER_SEND_BYTES - replaced * PER_KEY_BYTES
        self.evicted += too_large
        order = self._order
        if order and (
            order[0].deadline <= now or self.entries > self.max_entries or self.nbytes > self.max_bytes
        ):
            self._trim(now)

    @staticmethod
    def same_body(sent: Sent, pos: int, body: bytes, store: MessageStore) -> bool:
        """Whether ``body`` is the body of ``sent``'s message ``pos`` (pending: the send's own,
        answered: the stored record's BODYCRC).  A key reused for another body is not a resend:
        a Java client keeps a Message object's UNIQ_KEY, so one object sent twice with different
        bodies would otherwise lose the second."""
        send = sent.send
        if send is not None:
            msgs = send.msgs
            return pos < len(msgs) and msgs[pos].body == body
        msg_id = sent.answer(pos)[0]
        try:
            offset = decode_message_id(msg_id)[1]
        except ValueError:
            return False
        head = store.look_message_by_offset(offset, 12)
        if head is None or len(head) < 12:
            return False
        return int.from_bytes(head[8:12], "big") == body_crc(body)

    def count_dropped(self, topic: str, n: int) -> None:
        dropped = self.dropped
        dropped[topic] = dropped.get(topic, 0) + n

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, sent: Sent, hashes: array[int], now: float) -> None:
        """``sent`` (made with ``hashes``, its keys') stored under its keys."""
        table = self._topics.get(sent.topic)
        if table is None:
            table = self._topics[sent.topic] = HashTable()
        n = len(hashes)
        replaced = table.put_record(hashes, sent)  # (the compiled table keeps the hashes)
        if replaced is not None:
            for old in replaced:
                self._unlink(old)
        sent.nbytes = nbytes = n * PER_KEY_BYTES + PER_SEND_BYTES
        self._order.append(sent)
        self.entries += n
        self.nbytes += nbytes
        order = self._order
        if order[0].deadline <= now or self.entries > self.max_entries or self.nbytes > self.max_bytes:
            self._trim(now)

    def _unlink(self, old: Sent) -> None:
        """A key of ``old`` is taken over (a key kept past its deadline, stored again)."""
        self.entries -= 1
        self.nbytes -= PER_KEY_BYTES

    def _trim(self, now: float) -> None:
        """Drop sends past their deadline, then the oldest while over a bound (one compiled call
        when built: ``_dedup_table.trim``)."""
        order = self._order
        if self._compiled_trim is not None:
            self.entries, self.nbytes, evicted = self._compiled_trim(
                order,
                self._topics,
                now,
                self.max_entries,
                self.max_bytes,
                self.entries,
                self.nbytes,
                PER_KEY_BYTES,
                PER_SEND_BYTES,
            )
            self.evicted += evicted
            return
        while order and (
            order[0].deadline <= now or self.entries > self.max_entries or self.nbytes > self.max_bytes
        ):
            sent = order.popleft()
            if sent.deadline > now:
                self.evicted += 1
            self._drop(sent, oldest=True)

    def _drop(self, sent: Sent, oldest: bool = False) -> None:
        """``sent``'s keys still its own leave the window (``oldest``: it is the oldest send,
        evicted: the compiled table then only advances its rings' tails)."""
        if not sent.live:
            return
        sent.live = False
        table = self._topics.get(sent.topic)
        removed = 0
        if table is not None:
            removed = table.evict(sent) if oldest else table.remove_record(sent)
            if not len(table):
                del self._topics[sent.topic]
        self.entries -= removed
        self.nbytes -= removed * PER_KEY_BYTES + PER_SEND_BYTES

    def expire(self) -> int:
        """Drop the sends past their deadline now, with no send arriving: a window is otherwise
        trimmed only when a send records a key, so a broker gone quiet kept its last window's
        records (~95 MB after 300 000 single sends).  The broker's housekeeping calls it every
        few seconds (``Broker._housekeeping_loop``).  How many sends left."""
        order = self._order
        if not order or self._rebuilding is not None:
            return 0
        now = self._clock()
        if order[0].deadline > now:
            return 0
        before = len(order)
        self._trim(now)
        return before - len(order)

    def forget(self, sent: Sent) -> None:
        """``sent`` was not stored: its keys leave the window now (its place in the order is
        skipped when reached)."""
        self._drop(sent)

    def close(self) -> None:
        """At the broker's stop: empty the window and let it be freed.  Its records are not
        walked by the cycle collector and point back at the window (and a pending one at its
        send, which points at it), so a window left full outlived its broker in the process."""
        self._generation += 1  # a rebuild still running is not adopted
        for sent in self._order:
            sent.send = None
        self.clear()
        self._topic_windows.clear()

    def clear(self) -> None:
        for sent in self._order:
            sent.live = False
        self._topics.clear()
        self._order.clear()
        self.entries = 0
        self.nbytes = 0

    def _follow_epoch(self) -> None:
        source = self.epoch_source
        assert source is not None
        epoch = source()
        if epoch != self._built_epoch:
            self._built_epoch = epoch
            self._start_rebuild()

    def built_for_epoch(self) -> None:
        """A rebuild just ran for the epoch in force now."""
        source = self.epoch_source
        self._built_epoch = source() if source is not None else None

    # ------------------------------------------------------------------ rebuild after a promotion
    @property
    def rebuilding(self) -> bool:
        """A rebuild runs (in a thread, after a promotion): sends wait for it."""
        return self._rebuilding is not None

    def serving(self) -> bool:
        """Whether sends may be checked now: follows the epoch (a new one starts the rebuild),
        then False while a rebuild runs (:meth:`wait_rebuilt` first)."""
        if self.epoch_source is not None:
            self._follow_epoch()
        return self._rebuilding is None

    async def wait_rebuilt(self, timeout: float = REBUILD_WAIT_S) -> bool:
        """Wait up to ``timeout`` seconds for a running rebuild; whether none runs now."""
        running = self._rebuilding
        if running is not None:
            try:
                await asyncio.wait_for(asyncio.shield(running), timeout)
            except TimeoutError:
                pass
            except Exception:
                pass  # logged by _adopt
        return self._rebuilding is None

    def _start_rebuild(self) -> None:
        """A new epoch: rebuild from the commit log.  On the broker's loop, in a thread into a
        scratch window adopted when done (the loop keeps serving: heartbeats, pulls; sends wait);
        without a running loop (a tool), here."""
        fill = self.fill
        if fill is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fill(self)
            return
        scratch = DuplicateWindow(
            self.window_s,
            self.max_entries,
            self.max_bytes,
            content=self.content,
            clock=self._clock,
            owner=self,
        )
        self._generation += 1
        generation = self._generation
        running = loop.run_in_executor(None, fill, scratch)
        self._rebuilding = running
        running.add_done_callback(lambda done: self._adopt(done, scratch, generation))
        log.info(
            "duplicate window: rebuilding from the commit log for epoch %s (in a thread)", self._built_epoch
        )

    def _adopt(self, done: asyncio.Future[None], scratch: DuplicateWindow, generation: int) -> None:
        """On the loop: the rebuild ``generation`` ended; its window becomes this one's."""
        if generation != self._generation:
            return  # a later epoch's rebuild runs: this one is stale
        self._rebuilding = None
        if done.cancelled() or done.exception() is not None:
            log.error(
                "duplicate window: the rebuild failed; the window starts empty",
                exc_info=None if done.cancelled() else done.exception(),
            )
            self.clear()
            return
        for sent in self._order:
            sent.live = False
        self._topics = scratch._topics
        self._order = scratch._order
        self.entries = scratch.entries
        self.nbytes = scratch.nbytes
        self.evicted += scratch.evicted
        self.rebuilt_records = scratch.rebuilt_records
        self.rebuilt_keys = scratch.rebuilt_keys
        self.rebuild_seconds = scratch.rebuild_seconds
        self._topic_windows.clear()

    # ------------------------------------------------------------------ rebuild (dedup_rebuild)
    def add_stored(
        self,
        topic: str,
        keys: list[str],
        msg_ids: list[str],
        queue_id: int,
        queue_offset: int,
        step: int,
        end: int,
        deadline: float,
        handle: str | None = None,
    ) -> None:
        """Records read back from the commit log (one put's, consecutive): kept answered.  The
        first copy wins: a key already in the window (a transaction's commit, a delivered timer
        message) keeps its first answer."""
        n = len(keys)
        if n > self.max_entries:
            return
        hashes = hashes_of(keys)
        table = self._topics.get(topic)
        if table is not None and table.any_of(hashes):
            for i, h in enumerate(hashes):
                if table.get(h) is None:
                    at = queue_offset + i * step
                    self.add_stored(topic, [keys[i]], [msg_ids[i]], queue_id, at, step, end, deadline, handle)
            return
        sent = Sent(self._owner, topic, hashes, deadline, None)
        sent.msg_id = msg_ids[0] if n == 1 else ",".join(msg_ids)
        sent.queue_id = queue_id
        sent.queue_offset = queue_offset
        sent.step = step
        sent.end = end
        sent.handle = handle
        self._add(sent, hashes, self._clock())

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO's ``dedup*`` keys."""
        return {
            "dedupWindowSeconds": f"{self.window_s:g}",
            "dedupEntries": str(self.entries),
            "dedupBytes": str(self.nbytes),
            "dedupMaxEntries": str(self.max_entries),
            "dedupMaxBytes": str(self.max_bytes),
            "dedupDropped": str(sum(self.dropped.values())),
            "dedupDroppedByTopic": ",".join(f"{t}:{n}" for t, n in sorted(self.dropped.items())),
            "dedupEvicted": str(self.evicted),
            "dedupRebuildRecords": str(self.rebuilt_records),
            "dedupRebuildSeconds": f"{self.rebuild_seconds:.3f}",
        }
