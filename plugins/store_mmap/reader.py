"""The read path of a pull: ConsumeQueue entries to the records they name (getMessage).

:func:`get_message` follows RocketMQ's ``DefaultMessageStore.getMessage``: statuses and
``next_begin_offset`` as its master gives them.  Two readers share the entries: the walk
(:func:`tidemq.message.scan_queue`, compiled when built) serves unfiltered and TAG pulls as views
of the mapped commit log, one pass per record; the careful loop takes what the walk stops at
(filler, a removed file, damage, an unreadable record) and the pulls of other filters (SQL92),
one entry at a time.

TAG pulls: RocketMQ's broker filters a TAG subscription on the entry's tag code only
(``ExpressionMessageFilter.isMatchedByCommitLog`` returns true for TAG) and leaves hash
collisions to the client, which compares the tag string.  This store also compares the stored
TAGS property, read in place by the walk, so a colliding tag never leaves the broker; the
clients' re-check then drops nothing.
"""

from __future__ import annotations

import logging

from tidemq.errors import CorruptDataError
from tidemq.filter import MessageFilter, queue_entry_check, tag_selection
from tidemq.message import SCAN_CAREFUL, decode_message, record_crc_ok, record_mismatch, scan_queue
from tidemq.store import GetResult, GetStatus, check_queue_offset

from .commitlog import CommitLog
from .consume_queue import CQ_ENTRY, CQ_STORE_UNIT_SIZE
from .reput import ConsumeQueueTable

log = logging.getLogger(__name__)

#: ConsumeQueue bytes scanned per pull at most (RocketMQ's maxFilterMessageCount).
MAX_FILTER_BYTES = 16000
_MIN = -(1 << 63)


def get_message(
    cqs: ConsumeQueueTable,
    commitlog: CommitLog,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    message_filter: MessageFilter | None,
    max_bytes: int,
    check_crc: bool,
    memory_for_messages: int,
) -> GetResult:
    """Up to ``max_count`` records (``max_bytes`` in all) of a queue from ``offset`` that match."""
    cq = cqs.find(topic, queue_id)
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
    max_phy = commitlog.get_max_offset()
    last_phy = 0
    buffers: list[memoryview] = []
    qoffsets: list[int] = []
    total = 0
    next_phy_file_start = _MIN
    limit = min(len(entries), max(MAX_FILTER_BYTES, max_count * CQ_STORE_UNIT_SIZE))
    limit -= limit % CQ_STORE_UNIT_SIZE
    entry_check = queue_entry_check(message_filter)
    tags = tag_selection(message_filter)
    topic_bytes = topic.encode()
    # Unfiltered and TAG pulls (the common cases) walk the entries in scan_queue (compiled when
    # built): every entry whose record is whole in one mapped file and is the entry's (and, for a
    # TAG pull, has a subscribed tag code and TAGS, read in place) is served as a view, in one
    # pass over each record; the loop below takes any other entry (filler, removed file, damage,
    # an unreadable record) one at a time, and the pulls of the other filters.
    scan = entry_check is None and (message_filter is None or tags is not None)
    i = 0
    # The response body in as few chunks as the records allow: a producer's batch lies back
    # to back in the log and goes out as one view (a chunk per record cost the pull path
    # ~15 % in sizes and iovecs).  Records taken one by one below are chunks of their own.
    wire: list[memoryview] = []
    while i < limit:
        if scan and next_phy_file_start == _MIN:
            mf = commitlog.queue.find_mapped_file_by_offset(CQ_ENTRY.unpack_from(entries, i)[0])
            window = mf.scan_window() if mf is not None else None
            if window is not None:
                i, total, seen, stop = scan_queue(
                    entries,
                    i,
                    limit,
                    window[0],
                    mf.file_from_offset,  # type: ignore[union-attr]
                    window[1],
                    topic_bytes,
                    queue_id,
                    offset,
                    max_count,
                    max_bytes,
                    check_crc,
                    buffers,
                    qoffsets,
                    total,
                    wire,
                    tags,
                )
                if seen >= 0:
                    last_phy = seen
                if buffers:
                    status = GetStatus.FOUND
                if stop != SCAN_CAREFUL:
                    break
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
            # a duplicate or garbage.  `tidemq store verify` names the damage; reload rebuilds.
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
        wire.append(data)
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
        wire=tuple(wire),
        # Reading this far behind the head means reading from disk: RocketMQ then suggests a slave.
        # (memory_for_messages: the store's, set by the broker from accessMessageInMemoryMaxRatio.)
        suggest_pulling_from_slave=max_phy - last_phy > memory_for_messages,
    )
