"""The duplicate window rebuilt from the commit log's tail (issue 37).

The window is derived from the commit log: every key it holds belongs to a record stored in the
last ``dedup_window_s`` seconds.  So it is rebuilt, not persisted: at start (a clean restart and
a SIGKILL alike) and when a slave becomes master (its commit log is the replicated copy of the
old master's), from the records stored since ``now - window``.  The tail's start is found through
the consume queues (per queue, the first entry stored at or after the cut, by binary search on
store time); the records from there to the log's end are read with the record decoder (compiled
when built), bodies skipped.

Which records give keys, as the send path keeps them:

* a record parked for later (``SCHEDULE_TOPIC_XXXX``: delay levels, ``rmq_sys_wheel_timer``:
  timer messages, ``RMQ_SYS_TRANS_HALF_TOPIC``: transactional halves) under its ``REAL_TOPIC`` and
  ``REAL_QID``, answered with the parked record (as its send was);
* a record in any other topic with ``REAL_TOPIC`` set is a delivery or a commit of a parked one:
  not a producer's send, skipped (its key is the parked record's, kept already);
* retry and dead-letter topics, the transactions' op topic: skipped (never windowed);
* everything else under its own topic and queue.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.broker.dedup import MAX_KEY_LENGTH, UNIQ_KEY, DuplicateWindow, content_key
from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.broker.transaction import HALF_TOPIC, OP_TOPIC
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.errors import CorruptDataError
from tidemq.message import (
    MESSAGE_MAGIC_CODE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    Prop,
    create_message_id,
    decode_message,
)
from tidemq.store import MessageStore, RawCommitLogStore

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)

__all__ = ["attach_window", "rebuild_window", "tail_start"]

#: Topics a record waits in before its producer's topic: keyed under REAL_TOPIC.
PARKING_TOPICS = frozenset((SCHEDULE_TOPIC, TIMER_TOPIC, HALF_TOPIC))
_SKIPPED_PREFIXES = ("%RETRY%", "%DLQ%")
_HEAD = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE
_REAL_TOPIC = Prop.REAL_TOPIC
_REAL_QID = Prop.REAL_QUEUE_ID


def tail_start(
    store: MessageStore, cut_ms: int, max_records: int | None = None, now_ms: int | None = None
) -> int:
    """The commit-log offset of the oldest record stored at or after ``cut_ms`` (through the
    consume queues); the log's end when there is none.  With ``max_records``, the cut moves later
    until the queues hold at most that many entries after it (the window keeps no more keys), so
    a rebuild reads a bounded tail however busy the broker was."""
    queues = [(t, q) for t, ids in store.topics().items() for q in ids]

    def after(cut: int) -> tuple[int, int]:
        start, count = store.get_max_phy_offset(), 0
        for topic, queue_id in queues:
            offset = store.get_offset_by_time(topic, queue_id, cut)
            top = store.get_max_offset_in_queue(topic, queue_id)
            if offset >= top:
                continue
            count += top - offset
            phys = store.get_commit_log_offset(topic, queue_id, offset)
            if 0 <= phys < start:
                start = phys
        return start, count

    start, count = after(cut_ms)
    if max_records is not None and count > max_records:
        lo, hi = cut_ms, now_ms if now_ms is not None else int(time.time() * 1000)
        while hi - lo > 1:  # the earliest cut (ms) that leaves at most max_records
            mid = (lo + hi) // 2
            if after(mid)[1] > max_records:
                lo = mid
            else:
                hi = mid
        start = after(hi)[0]
    return max(start, store.get_min_phy_offset())


def rebuild_window(
    window: DuplicateWindow,
    store: MessageStore,
    topic_settings: Callable[[str], tuple[float, bool]],
    *,
    horizon_s: float | None = None,
    wall_ms: int | None = None,
    recall_handle: Callable[[MessageInner], str | None] | None = None,
) -> None:
    """Empty ``window`` and fill it from the records of the last ``window.window_s`` seconds
    (``topic_settings(topic)``: a topic's own seconds, 0 for none, and whether it is keyed on
    content)."""
    started = time.perf_counter()
    window.clear()
    horizon = max(window.window_s if horizon_s is None else horizon_s, 0.0)
    if not isinstance(store, RawCommitLogStore):
        window.rebuilt_records = window.rebuilt_keys = 0
        window.rebuild_seconds = time.perf_counter() - started
        return  # an in-memory store keeps nothing over a restart: nothing to rebuild
    now_wall = wall_ms if wall_ms is not None else int(time.time() * 1000)
    now_mono = time.monotonic()
    offset = (
        tail_start(store, now_wall - int(horizon * 1000), window.max_entries, now_wall)
        if horizon > 0
        else store.get_max_phy_offset()
    )
    end = store.get_max_phy_offset()
    file_size = store.commit_log_file_size
    records = 0
    windows: dict[str, tuple[float, bool]] = {}
    group: list = []  # one put's records: (key, msg id); flushed on any change
    g_topic = ""
    g_qid = g_qoff = g_ts = g_step = g_end = -1
    g_deadline = 0.0
    g_handle: str | None = None

    def flush() -> None:
        if group:
            window.add_stored(
                g_topic,
                [k for k, _ in group],
                [i for _, i in group],
                g_qid,
                g_qoff,
                g_step,
                g_end,
                g_deadline,
                g_handle,
            )
            group.clear()

    while offset < end:
        view = store.get_commit_log_data(offset)
        if view is None or len(view) < _HEAD.size:
            offset += file_size - offset % file_size  # a hole or a file's end: the next file
            continue
        pos = 0
        length = len(view)
        rolled = False
        while pos + _HEAD.size <= length:
            size, magic = _HEAD.unpack_from(view, pos)
            if magic != MESSAGE_MAGIC_CODE or size <= 0 or pos + size > length:
                rolled = True  # BLANK filler (or what recovery left): the rest of the file is empty
                break
            try:
                ext = decode_message(view, pos, with_body=False)
            except CorruptDataError:
                pos += size
                continue
            at = pos
            pos += size
            records += 1
            props = ext.properties
            topic = ext.topic
            real = props.get(_REAL_TOPIC)
            if real is not None:
                if topic not in PARKING_TOPICS:
                    continue  # a delivery or a commit of a parked record
                try:
                    queue_id = int(props.get(_REAL_QID, "0"))
                except ValueError:
                    queue_id = 0
                topic = real
            else:
                if topic in PARKING_TOPICS or topic == OP_TOPIC or topic.startswith(_SKIPPED_PREFIXES):
                    continue
                queue_id = ext.queue_id
            tx = ext.sys_flag & TRANSACTION_TYPE_MASK
            if tx == TRANSACTION_COMMIT_TYPE:
                continue
            settings = windows.get(topic)
            if settings is None:
                settings = windows[topic] = topic_settings(topic)
            seconds, content = settings
            if seconds <= 0:
                continue
            key: str | None
            if content:
                key = content_key(ext.flag, decode_message(view, at).body, props)
            else:
                key = props.get(UNIQ_KEY)
                if not key or len(key) > MAX_KEY_LENGTH:
                    continue
            deadline = now_mono - (now_wall - ext.store_timestamp) / 1000 + seconds
            if deadline <= now_mono:
                continue
            step = 0 if tx in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE) else 1
            qoff = ext.queue_offset
            handle = None
            if recall_handle is not None and ext.topic == TIMER_TOPIC:
                handle = recall_handle(MessageInner(TIMER_TOPIC, b"", properties=props))
            if not (
                group
                and handle is None
                and g_handle is None
                and topic == g_topic
                and queue_id == g_qid
                and ext.store_timestamp == g_ts
                and qoff == g_qoff + len(group) * g_step
                and step == g_step
            ):
                flush()
                g_topic, g_qid, g_qoff, g_ts, g_step, g_deadline, g_handle = (
                    topic,
                    queue_id,
                    qoff,
                    ext.store_timestamp,
                    step,
                    deadline,
                    handle,
                )
            group.append((key, create_message_id(ext.store_host, ext.commit_log_offset)))
            g_end = ext.commit_log_offset + ext.store_size
        flush()
        if rolled or pos == 0:
            offset += file_size - offset % file_size
        else:
            offset += pos
    flush()
    window.rebuilt_records = records
    window.rebuilt_keys = window.entries
    window.rebuild_seconds = time.perf_counter() - started
    window.built_for_epoch()
    log.info(
        "duplicate window rebuilt from the commit log's last %gs: %d records read, %d keys, %.3fs",
        horizon,
        records,
        window.entries,
        window.rebuild_seconds,
    )


def attach_window(broker: BrokerContext, window: DuplicateWindow) -> None:
    """Build ``broker``'s window now (start: after the store recovered, before the broker
    serves), and again whenever the controller's epoch changes (a slave promoted): then in a
    thread, into a scratch window the live one adopts when done, sends waiting meanwhile
    (:meth:`~tidemq.broker.dedup.DuplicateWindow.serving`)."""

    def fill(target: DuplicateWindow) -> None:
        def topic_settings(topic: str) -> tuple[float, bool]:
            return target.topic_settings(topic, broker.topics.get(topic))

        # The longest window in force: a topic's attribute may be longer than dedup_window_s.
        horizon = target.window_s
        for name, cfg in list(broker.topics.all().items()):
            horizon = max(horizon, target.topic_window(name, cfg))
        rebuild_window(
            target, broker.store, topic_settings, horizon_s=horizon, recall_handle=broker.timers.recall_handle
        )

    role_aware = broker.role_aware
    window.fill = fill
    window.epoch_source = role_aware.current_epoch if role_aware is not None else None
    fill(window)
    window.built_for_epoch()
