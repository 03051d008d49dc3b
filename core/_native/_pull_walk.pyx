# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The pull path's walk of ConsumeQueue entries, compiled: :func:`scan_queue`.

The Python reference is :func:`tidemq.record.scan_queue`; :mod:`tidemq.message` picks this one at
import when it is built.  With ``tags`` (a TAG subscription) the walk filters in the same pass:
the entry's tag code first, then the TAGS property read in place in the record, so no record is
decoded to a message object on the broker (RocketMQ's broker stops at the code).
"""

include "_support.pxi"
include "_fields.pxi"
include "_pull_core.pxi"


def scan_queue(entries, Py_ssize_t start, Py_ssize_t limit, file_view, int64_t file_from,
               int64_t readable, bytes topic, int64_t queue_id, int64_t first_queue_offset,
               Py_ssize_t max_count, int64_t max_bytes, bint check_crc, list buffers,
               list queue_offsets, int64_t total, list runs=None, tuple tags=None):
    """The pull path's walk of ConsumeQueue entries (:func:`tidemq.record.scan_queue`)."""
    if buffers is None or queue_offsets is None:
        raise TypeError("buffers and queue_offsets must be lists")
    i, _count, total, last_phy, stop = _walk(
        entries, start, limit, file_view, file_from, readable, topic, queue_id,
        first_queue_offset, max_count, max_bytes, check_crc, buffers, queue_offsets, total, runs, tags)
    return i, total, last_phy, stop
