"""The consume-queue table and the one dispatch path of every stored record.

RocketMQ's counterparts: ``DefaultMessageStore.consumeQueueTable`` (:class:`ConsumeQueueTable`)
and ``ReputMessageService.doReput`` with its ``CommitLogDispatcher`` list (:class:`Reput`).
RocketMQ's reput is a thread that follows the commit log; here the write path dispatches inline
under the store's lock instead (under the GIL a thread would only add a hand-off), and
:class:`Reput` follows the log only where records arrive without a put: at recovery and when a
master's bytes are replicated in.  Either way a record takes one path: its ConsumeQueue entry,
the dispatch requests (:func:`tidemq.store.dispatch_messages`), then an arrival for long polling.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from tidemq.delay import SCHEDULE_TOPIC, schedule_tags_code
from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageExt,
    tags_hash_code,
)
from tidemq.names import InvalidNameError, topic_dir
from tidemq.store import (
    ArrivalNotifier,
    BatchDispatcher,
    DispatchedPut,
    Dispatcher,
    GroupDispatcher,
    dispatch_messages,
    takes_groups,
)

from .commitlog import CommitLog
from .consume_queue import ConsumeQueue
from .options import MmapStoreOptions

log = logging.getLogger(__name__)

#: Prepared and rolled-back transaction halves are not consumable: no queue entry, no arrival.
NOT_CONSUMABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)

#: Tags repeat across messages; Java's String.hashCode in Python costs microseconds per call.
_tags_code = functools.lru_cache(maxsize=65536)(tags_hash_code)


def _batch_calls(dispatchers: Sequence[Dispatcher]) -> list[Callable[..., None]] | None:
    """The dispatchers' ``dispatch_batch`` methods, or None when one of them takes no batches."""
    calls = []
    for d in dispatchers:
        if not isinstance(d, BatchDispatcher):
            return None
        calls.append(d.dispatch_batch)
    return calls


def _group_calls(dispatchers: Sequence[Dispatcher]) -> list[Callable[[Sequence[DispatchedPut]], None]] | None:
    """The dispatchers' ``dispatch_groups`` methods, or None when one of them has none."""
    calls: list[Callable[[Sequence[DispatchedPut]], None]] = []
    for d in dispatchers:
        if not takes_groups(d):
            return None
        calls.append(cast(GroupDispatcher, d).dispatch_groups)
    return calls


def consumable(sys_flag: int) -> bool:
    return sys_flag & TRANSACTION_TYPE_MASK not in NOT_CONSUMABLE


class ConsumeQueueTable:
    """Topic -> queue id -> :class:`ConsumeQueue` (RocketMQ's consumeQueueTable).

    Queues are created and removed under the store's lock; readers look them up without it (a
    dict lookup is atomic under the GIL, and a queue is never replaced once created).
    """

    def __init__(self, root: Path, options: MmapStoreOptions) -> None:
        self.root = root
        self.options = options
        self.queues: dict[str, dict[int, ConsumeQueue]] = {}
        #: Store time of the newest entry written: the checkpoint's logics timestamp once flushed.
        self.last_entry_ts = 0

    def for_write(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created on its first entry (``InvalidNameError`` for a topic no put allows)."""
        queues = self.queues.get(topic)
        cq = queues.get(queue_id) if queues is not None else None
        if cq is None:
            cq = ConsumeQueue(
                topic, queue_id, self.root, self.options.consumequeue_entries, self.options.file_allocation
            )
            self.queues.setdefault(topic, {})[queue_id] = cq
        return cq

    def add(self, cq: ConsumeQueue) -> None:
        """A queue loaded from disk (recovery)."""
        self.queues.setdefault(cq.topic, {})[cq.queue_id] = cq

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queues = self.queues.get(topic)
        return queues.get(queue_id) if queues is not None else None

    def entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        """(log offset, size, tags code) of the entry at queue ``offset``; None outside the queue."""
        cq = self.find(topic, queue_id)
        if cq is None or not cq.min_offset_in_queue <= offset < cq.max_offset_in_queue:
            return None
        return cq.get_entry(offset)

    def all_queues(self) -> list[ConsumeQueue]:
        # Copies: a put may add a queue while a service thread walks them.
        return [cq for qs in list(self.queues.values()) for cq in list(qs.values())]

    def shutdown(self) -> None:
        for cq in self.all_queues():
            cq.shutdown()

    def topics(self) -> dict[str, list[int]]:
        return {t: sorted(qs) for t, qs in list(self.queues.items()) if qs}

    def delete_topics(self, topics: Sequence[str]) -> None:
        """Destroy the topics' queues and directories (the store's lock held)."""
        for t in topics:
            queues = self.queues.pop(t, None)
            for cq in (queues or {}).values():
                cq.destroy()
            try:
                # A name that is no topic has no directory here: nothing outside is touched.
                topic_dir(self.root, t).rmdir()
            except (OSError, InvalidNameError):
                pass


class Reput:
    """Hands stored records to the dispatchers and the arrival listeners.

    :meth:`dispatch` is the common tail (called once per batch by the write path, which writes
    the queue entries itself, packed); :meth:`redispatch` is the whole path for one record read
    back from the log; :meth:`reput` follows the log from :attr:`reput_from` (replication).
    """

    def __init__(
        self,
        commitlog: CommitLog,
        cqs: ConsumeQueueTable,
        delay_levels: Sequence[int],
        notifier: ArrivalNotifier,
    ) -> None:
        self.commitlog = commitlog
        self.cqs = cqs
        self.delay_levels = delay_levels
        self.dispatchers: list[Dispatcher] = []
        self.notifier = notifier
        self.listeners = notifier.listeners
        #: Where dispatch of records not put through this store resumes (replication).
        self.reput_from = 0
        self._bad_topics: set[str] = set()  # logged once each: records whose topic is no name
        #: Each dispatcher's ``dispatch_batch`` when all of them take batches (None otherwise),
        #: for the dispatchers as they were then (``_batch_for``).
        self._batch_calls: list[Callable[..., None]] | None = None
        self._batch_for: list[Dispatcher] = []
        #: The same for ``dispatch_groups`` (:class:`tidemq.store.GroupDispatcher`).
        self._group_calls: list[Callable[[Sequence[DispatchedPut]], None]] | None = None
        self._group_for: list[Dispatcher] = []

    def dispatch(
        self,
        msgs: Sequence[Any],
        offsets: Sequence[int],
        sizes: Sequence[int],
        tags: Sequence[int],
        ts: int,
        queue_offset: int,
        arrived: bool,
        columns: tuple[list[dict[str, str]], list[int]] | None = None,
    ) -> None:
        """Dispatch records of one queue (consecutive queue offsets), then note their arrival.

        Called with the store's lock held, once per put: dispatchers see commit-log order.  A
        :class:`tidemq.store.BatchDispatcher` (the hash index) gets the whole batch in one call and
        only queues it (its own thread indexes it; its queries index what is queued first, so a
        key is queryable by the time the put resolves).  ``arrived``: the records are consumable
        (they have queue entries), so a held pull may now find them.  ``columns``: the messages'
        properties and flags, when the put's prepare step read them already.
        """
        dispatchers = self.dispatchers
        if dispatchers:
            if columns is not None:
                if dispatchers != self._batch_for:  # a list of one or two: identity compares
                    self._batch_calls = _batch_calls(dispatchers)
                    self._batch_for = list(dispatchers)
                calls = self._batch_calls
            else:
                calls = None
            if calls is not None:
                # Every dispatcher takes batches and the columns are here: dispatch_messages'
                # calls, without its walk over the dispatchers (the same arguments, the same
                # logging of a failure).
                first = msgs[0]
                for call in calls:
                    try:
                        call(
                            first.topic,
                            first.queue_id,
                            columns[0],  # type: ignore[index]
                            offsets,
                            sizes,
                            tags,
                            ts,
                            queue_offset,
                            columns[1],  # type: ignore[index]
                        )
                    except Exception:
                        log.exception("dispatcher %r failed", getattr(call, "__self__", call))
            elif columns is None:
                dispatch_messages(self.dispatchers, msgs, offsets, sizes, tags, ts, queue_offset)
            else:
                dispatch_messages(
                    self.dispatchers,
                    msgs,
                    offsets,
                    sizes,
                    tags,
                    ts,
                    queue_offset,
                    properties=columns[0],
                    sys_flags=columns[1],
                )
        if arrived and self.listeners:
            first = msgs[0]
            self.notifier.arrived(first.topic, first.queue_id, queue_offset + len(msgs))

    def batch_calls(self) -> list[Callable[..., None]] | None:
        """Each dispatcher's ``dispatch_batch`` when every one takes batches (None otherwise), as
        :meth:`dispatch` calls them: for a writer that dispatches several puts in a row."""
        dispatchers = self.dispatchers
        if dispatchers != self._batch_for:  # a list of one or two: identity compares
            self._batch_calls = _batch_calls(dispatchers)
            self._batch_for = list(dispatchers)
        return self._batch_calls

    def group_calls(self) -> list[Callable[[Sequence[DispatchedPut]], None]] | None:
        """Each dispatcher's ``dispatch_groups`` when every one has it (None otherwise): for a
        writer that dispatches a call's puts at once (:mod:`tidemq_store_mmap.group_put`)."""
        dispatchers = self.dispatchers
        if dispatchers != self._group_for:
            self._group_calls = _group_calls(dispatchers)
            self._group_for = list(dispatchers)
        return self._group_calls

    def schedule_tags(self, properties: Mapping[str, str], ts: int, tags: int) -> int:
        """A SCHEDULE_TOPIC_XXXX entry's tags code: its delivery time, as RocketMQ stores it."""
        code = schedule_tags_code(self.delay_levels, properties, ts)
        return tags if code is None else code

    def record_tags(self, msg: MessageExt) -> int:
        tags = _tags_code(msg.tags)
        if msg.topic == SCHEDULE_TOPIC:
            return self.schedule_tags(msg.properties, msg.store_timestamp, tags)
        return tags

    def redispatch(self, msg: MessageExt, offset: int, notify: bool = False) -> None:
        """One record read back from the log at ``offset``: queue entry, dispatch, arrival.

        Recovery (single-threaded, before start) passes ``notify=False``: nothing is waiting yet.
        """
        is_consumable = consumable(msg.sys_flag)
        if not (is_consumable or self.dispatchers):
            return
        tags = self.record_tags(msg)
        if is_consumable:
            self._put_entry(msg, tags)
        notify = notify and is_consumable
        if self.dispatchers or (notify and self.listeners):
            self.dispatch(
                [msg], [offset], [msg.store_size], [tags], msg.store_timestamp, msg.queue_offset, notify
            )

    def _put_entry(self, msg: MessageExt, tags: int) -> None:
        try:
            cq = self.cqs.for_write(msg.topic, msg.queue_id)
        except InvalidNameError as exc:
            # A record no put could have made (replicated from a hostile or buggy master, or
            # written by hand): it stays in the log, but gets no queue and no directory.
            if msg.topic not in self._bad_topics:
                self._bad_topics.add(msg.topic)
                log.error("record at %d has no queue entry: %s", msg.commit_log_offset, exc)
            return
        cq.put(msg.commit_log_offset, msg.store_size, tags, msg.queue_offset)
        self.cqs.last_entry_ts = msg.store_timestamp

    def reput(self) -> None:
        """Dispatch the complete records from :attr:`reput_from` to the end of the log (lock held).

        A record split across two replicated chunks is dispatched when its last bytes arrive.
        """
        commitlog = self.commitlog
        files = commitlog.queue
        while True:
            for offset, msg in commitlog.iter_records(self.reput_from):
                self.redispatch(msg, offset, notify=True)
                mf = files.find_mapped_file_by_offset(offset)
                if mf is not None:
                    mf.store_timestamp = msg.store_timestamp
                self.reput_from = offset + msg.store_size
            # A BLANK at the end of a file moves the reput offset to the next file.
            mf = files.find_mapped_file_by_offset(self.reput_from)
            if mf is None or self.reput_from >= commitlog.get_max_offset():
                return
            view = mf.view_from(self.reput_from - mf.file_from_offset)
            if view is None or commitlog.check_record(view, 0, False)[0] != "blank":
                return
            self.reput_from = commitlog.roll_next_file(self.reput_from)
