# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""SEND_BATCH_MESSAGE bodies, compiled: :func:`decode_batch` and :func:`decode_batch_messages`.

The Python reference is :func:`tidemq.record.decode_batch` / :func:`tidemq.record.decode_batch_messages`;
:mod:`tidemq.message` picks these at import when this module is built.  Malformed or unusual input
goes to the reference, which raises its own error (see :mod:`tidemq._native`).
"""

include "_support.pxi"
include "_fields.pxi"


# ---------------------------------------------------------------------------- SEND_BATCH_MESSAGE bodies

cdef object _new_item(body, int32_t flag, props):
    if _item_off[0] < 0:
        return BatchItem(body, flag, props)
    item = _new(BatchItem)
    tq_set_slot(<PyObject *>item, _item_off[0], <PyObject *>body)
    tq_slot_long(<PyObject *>item, _item_off[1], flag)
    tq_set_slot(<PyObject *>item, _item_off[2], <PyObject *>props)
    return item


cdef object _new_inner(body, flag, props, tuple header):
    """A MessageInner of one batch entry; ``header`` holds the request's shared field objects:
    (topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times, 0)."""
    msg = _new(MessageInner)
    cdef PyObject *m = <PyObject *>msg
    tq_set_slot(m, _inner_off[0], <PyObject *>header[0])
    tq_set_slot(m, _inner_off[1], <PyObject *>body)
    tq_set_slot(m, _inner_off[2], <PyObject *>header[1])
    tq_set_slot(m, _inner_off[3], <PyObject *>flag)
    tq_set_slot(m, _inner_off[4], <PyObject *>props)
    tq_set_slot(m, _inner_off[5], <PyObject *>header[2])
    tq_set_slot(m, _inner_off[6], <PyObject *>header[3])
    tq_set_slot(m, _inner_off[7], <PyObject *>header[4])
    tq_set_slot(m, _inner_off[8], <PyObject *>header[5])
    tq_set_slot(m, _inner_off[9], <PyObject *>header[6])
    tq_set_slot(m, _inner_off[10], <PyObject *>header[7])
    return msg


cdef object _decode_batch(const uint8_t *p, Py_ssize_t n, Py_ssize_t limit, tuple header=None):
    """The items (with ``header``: the MessageInners), or None when the body is malformed or over
    ``limit`` (-1: none) messages."""
    cdef list items = []
    cdef Py_ssize_t pos = 0, count = 0, b, e, stop
    cdef int32_t size, flag, body_len
    cdef int16_t props_len
    while pos < n:
        if limit >= 0 and count >= limit:
            return None
        if n - pos < 20:
            return None
        size = tq_i32(p + pos)
        flag = tq_i32(p + pos + 12)
        body_len = tq_i32(p + pos + 16)
        if size < 22 or size > n - pos or body_len < 0:
            return None
        b = pos + 20
        e = b + body_len
        if e > n - 2:  # PROPERTIESLENGTH past the data
            return None
        props_len = tq_i16(p + e)
        stop = e + 2 + props_len
        if stop != pos + size:
            return None
        # A negative PROPERTIESLENGTH that balances a body running past the entry is what the
        # reference takes too: its slice of the properties is then empty.
        body = PyBytes_FromStringAndSize(<const char *>p + b, body_len)
        props = _parse_props(p, e + 2, stop)
        if props is None:
            return None
        if header is None:
            items.append(_new_item(body, flag, props))
        else:
            items.append(_new_inner(body, flag, props, header))
        pos += size
        count += 1
    return items


def decode_batch(buf, max_count=None):
    """Decode a SEND_BATCH_MESSAGE body (:func:`tidemq.record.decode_batch`)."""
    cdef Py_buffer view
    cdef Py_ssize_t limit = -1
    cdef int64_t m = 0
    if not _bound:
        _bind()
    if max_count is not None:
        rc = _as_i64(max_count, &m)
        if rc != 0:
            return _ref.decode_batch(buf, max_count)
        limit = 0 if m < 0 else <Py_ssize_t>m
    if _get_buffer(buf, &view, PyBUF_SIMPLE) < 0:
        return _ref.decode_batch(buf, max_count)
    try:
        items = _decode_batch(<const uint8_t *>view.buf, view.len, limit)
    finally:
        PyBuffer_Release(&view)
    if items is None:
        items = _ref.decode_batch(buf, max_count)  # raises the reference's error
        _disagreed()
    return items


def decode_batch_messages(
    buf, max_count, topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times
):
    """Decode a SEND_BATCH_MESSAGE body straight to MessageInners
    (:func:`tidemq.record.decode_batch_messages`)."""
    cdef Py_buffer view
    cdef Py_ssize_t limit = -1
    cdef int64_t m = 0
    cdef int32_t i32
    if not _bound:
        _bind()
    args = (buf, max_count, topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times)
    # Anything unusual (no slot access, a field the reference would store as given but we would
    # not) goes to the reference, which builds the messages its ordinary way.
    if (
        _inner_off[0] < 0
        or type(topic) is not str
        or type(queue_id) is not int
        or type(sys_flag) is not int
        or type(born_timestamp) is not int
        or type(reconsume_times) is not int
        or type(born_host) is not tuple
        or type(store_host) is not tuple
    ):
        return _ref.decode_batch_messages(*args)
    if max_count is not None:
        if _as_i64(max_count, &m) != 0:
            return _ref.decode_batch_messages(*args)
        limit = 0 if m < 0 else <Py_ssize_t>m
    if _get_buffer(buf, &view, PyBUF_SIMPLE) < 0:
        return _ref.decode_batch_messages(*args)
    header = (topic, queue_id, sys_flag, born_timestamp, born_host, store_host, reconsume_times, 0)
    try:
        msgs = _decode_batch(<const uint8_t *>view.buf, view.len, limit, header)
    finally:
        PyBuffer_Release(&view)
    if msgs is None:
        msgs = _ref.decode_batch_messages(*args)  # raises the reference's error
        _disagreed()
    return msgs


