# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The pull lane's walk, compiled (issue 38): :func:`walk`.

The same walk of ConsumeQueue entries as :func:`tidemq._native._pull_walk.scan_queue` (one loop,
``_pull_core.pxi``), without a Python object per message: the records taken are counted and
given as maximal back-to-back runs, views of the mapped commit-log file (a pull response's body
as the transport writes it, ``writev`` or ``sendfile``).  The Python reference is
:func:`tidemq.record.scan_queue` with ``runs``: the same index, total, last offset and stop, and
``count == len(buffers)``.  The store's pull lane (:mod:`tidemq_store_mmap.pull_lane`) serves a
pull with it only when the walk ends without needing the careful path (``stop != 2``).
"""

include "_support.pxi"
include "_fields.pxi"
include "_pull_core.pxi"


def walk(entries, Py_ssize_t start, Py_ssize_t limit, file_view, int64_t file_from,
         int64_t readable, bytes topic, int64_t queue_id, int64_t first_queue_offset,
         Py_ssize_t max_count, int64_t max_bytes, bint check_crc, tuple tags=None):
    """``(index, count, total bytes, last commit-log offset seen or -1, SCAN_*, runs)``."""
    cdef list runs = []
    i, count, total, last_phy, stop = _walk(
        entries, start, limit, file_view, file_from, readable, topic, queue_id,
        first_queue_offset, max_count, max_bytes, check_crc, None, None, 0, runs, tags)
    return i, count, total, last_phy, stop, runs
