# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""RocketMQ's offset message id, compiled: :func:`create_message_id`.

The Python reference is :func:`tidemq.message.py_create_message_id`; :mod:`tidemq.message` picks
this one at import when this module is built.
"""

include "_support.pxi"
include "_fields.pxi"


# ---------------------------------------------------------------------------- message ids

cdef object _id_host = None    # the last store host seen by create_message_id (a tuple)
cdef str _id_prefix = None


def create_message_id(store_host, commit_log_offset):
    """RocketMQ's offset message id (:func:`tidemq.message.py_create_message_id`)."""
    global _id_host, _id_prefix
    cdef int64_t offset
    if not _bound:
        _bind()
    if not PyLong_CheckExact(commit_log_offset) or _as_i64(commit_log_offset, &offset) != 0:
        return _ref_create_message_id(store_host, commit_log_offset)
    prefix = _id_prefix
    if store_host is not _id_host:
        if type(store_host) is not tuple:
            return _ref_create_message_id(store_host, commit_log_offset)
        prefix = _host_bytes(store_host)[0].hex().upper()
        _id_host = store_host
        _id_prefix = prefix
    return _hex_id(prefix, <uint64_t>offset)


