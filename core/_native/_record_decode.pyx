# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""Stored records, compiled: :func:`decode_message`, :func:`iter_messages` and the checks on a served
record, :func:`record_crc_ok` and :func:`record_mismatch`.

The Python reference is the same names in :mod:`tidemq.record`; :mod:`tidemq.message` picks these
at import when this module is built.  A record the fast path refuses goes to the reference, which
raises its own error (see :mod:`tidemq._native`).
"""

include "_support.pxi"
include "_fields.pxi"


# ---------------------------------------------------------------------------- record decoding

cdef object _decode_at(const uint8_t *data, Py_ssize_t n, Py_ssize_t pos, bint check_crc, bint with_body):
    """The MessageExt of the record at ``pos``, or None when it is not a valid record."""
    cdef const uint8_t *r
    cdef int32_t total, crc, queue_id, flag, sys_flag, reconsume, body_len
    cdef int64_t queue_offset, phys, born_ts, store_ts, prepared
    cdef Py_ssize_t q, iplen, topic_len
    cdef int16_t props_len
    if pos > n or n - pos < 48:
        return None
    r = data + pos
    total = tq_i32(r)
    if tq_u32(r + 4) != MAGIC or total < 48 or total > n - pos:
        return None
    crc = tq_i32(r + 8)
    queue_id = tq_i32(r + 12)
    flag = tq_i32(r + 16)
    queue_offset = tq_i64(r + 20)
    phys = tq_i64(r + 28)
    sys_flag = tq_i32(r + 36)
    born_ts = tq_i64(r + 40)
    q = 48
    iplen = 16 if sys_flag & BORN_V6 else 4
    if q + iplen + 4 + 8 > total:
        return None
    born_host = _host_tuple(r + q, iplen)
    q += iplen + 4
    store_ts = tq_i64(r + q)
    q += 8
    iplen = 16 if sys_flag & STORE_V6 else 4
    if q + iplen + 4 + 16 > total:
        return None
    store_host = _host_tuple(r + q, iplen)
    q += iplen + 4
    reconsume = tq_i32(r + q)
    prepared = tq_i64(r + q + 4)
    body_len = tq_i32(r + q + 12)
    q += 16
    if body_len < 0 or body_len > total - q:
        return None
    if check_crc and <int64_t>(_crc_mem(r + q, body_len) & 0x7FFFFFFF) != crc:
        return None
    body = PyBytes_FromStringAndSize(<const char *>r + q, body_len) if with_body else b""
    q += body_len
    if q >= total:
        return None
    topic_len = r[q]
    q += 1
    if q + topic_len + 2 > total:
        return None
    topic = _topic_str(r + q, topic_len)
    if topic is None:
        return None
    q += topic_len
    props_len = tq_i16(r + q)
    q += 2
    if props_len < 0 or q + props_len != total:
        return None
    props = _parse_props(r, q, total)
    if props is None:
        return None
    if _ext_off[0] < 0:
        return MessageExt(
            topic, body, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_host, store_ts,
            store_host, reconsume, prepared, props, crc, total,
        )
    msg = _new(MessageExt)
    cdef PyObject *m = <PyObject *>msg
    tq_set_slot(m, _ext_off[0], <PyObject *>topic)
    tq_set_slot(m, _ext_off[1], <PyObject *>body)
    tq_slot_long(m, _ext_off[2], queue_id)
    tq_slot_long(m, _ext_off[3], flag)
    tq_slot_long(m, _ext_off[4], queue_offset)
    tq_slot_long(m, _ext_off[5], phys)
    tq_slot_long(m, _ext_off[6], sys_flag)
    tq_slot_long(m, _ext_off[7], born_ts)
    tq_set_slot(m, _ext_off[8], <PyObject *>born_host)
    tq_slot_long(m, _ext_off[9], store_ts)
    tq_set_slot(m, _ext_off[10], <PyObject *>store_host)
    tq_slot_long(m, _ext_off[11], reconsume)
    tq_slot_long(m, _ext_off[12], prepared)
    tq_set_slot(m, _ext_off[13], <PyObject *>props)
    tq_slot_long(m, _ext_off[14], crc)
    tq_slot_long(m, _ext_off[15], total)
    return msg


cdef inline bint _exact_index(obj, Py_ssize_t *out):
    """An exact int in [0, PY_SSIZE_T_MAX]."""
    cdef int64_t v
    if not PyLong_CheckExact(obj) or _as_i64(obj, &v) != 0 or v < 0:
        return False
    out[0] = <Py_ssize_t>v
    return True


def decode_message(buf, pos=0, *, check_crc=False, with_body=True):
    """Decode the record at ``pos`` (:func:`tidemq.record.decode_message`)."""
    cdef Py_buffer view
    cdef Py_ssize_t at
    cdef bint crc = check_crc, keep_body = with_body
    if not _bound:
        _bind()
    if not _exact_index(pos, &at) or _get_buffer(buf, &view, PyBUF_SIMPLE) < 0:
        return _ref.decode_message(buf, pos, check_crc=check_crc, with_body=with_body)
    try:
        msg = _decode_at(<const uint8_t *>view.buf, view.len, at, crc, keep_body)
    finally:
        PyBuffer_Release(&view)
    if msg is None:
        msg = _ref.decode_message(buf, pos, check_crc=check_crc, with_body=with_body)
        _disagreed()
    return msg


cdef class MessageIterator:
    """:func:`iter_messages`: the records of a buffer one after another (a pull response body)."""

    cdef object buf
    cdef Py_ssize_t pos
    cdef Py_ssize_t end
    cdef bint check_crc
    cdef bint started
    cdef bint done

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_buffer view
        if not _bound:
            _bind()
        if self.done:
            raise StopIteration
        if not self.started:  # as the reference generator: len() on the first next()
            self.end = len(self.buf)
            self.started = True
        if self.pos >= self.end:
            self.done = True
            raise StopIteration
        if _get_buffer(self.buf, &view, PyBUF_SIMPLE) < 0:  # not a byte buffer: the reference's
            self.done = True
            msg = _ref.decode_message(self.buf, self.pos, check_crc=self.check_crc)
            self.done = False
            self.pos += msg.store_size
            return msg
        try:
            msg = _decode_at(<const uint8_t *>view.buf, view.len, self.pos, self.check_crc, True)
        finally:
            PyBuffer_Release(&view)
        if msg is None:
            self.done = True  # the reference raises: the iteration ends there, as a generator's
            msg = _ref.decode_message(self.buf, self.pos, check_crc=self.check_crc)
            self.done = False
            _disagreed()
            self.pos += msg.store_size
        else:
            self.pos += (<object>tq_get_slot(<PyObject *>msg, _ext_off[15])) if _ext_off[0] >= 0 else msg.store_size
        return msg


def iter_messages(buf, *, check_crc=False):
    """Decode consecutive records until the buffer ends (:func:`tidemq.record.iter_messages`)."""
    if not _bound:
        _bind()
    cdef MessageIterator it = MessageIterator.__new__(MessageIterator)
    it.buf = buf
    it.check_crc = bool(check_crc)
    return it


# ---------------------------------------------------------------------------- checks on served records

def record_crc_ok(record):
    """Whether a record's body still matches its BODYCRC (:func:`tidemq.record.record_crc_ok`)."""
    cdef Py_buffer view
    cdef const uint8_t *p
    cdef Py_ssize_t n, at
    cdef uint32_t stored
    cdef int32_t body_len
    cdef bint ok = False
    if _get_buffer(record, &view, PyBUF_SIMPLE) < 0:
        if not _bound:
            _bind()
        return _ref.record_crc_ok(record)
    try:
        p = <const uint8_t *>view.buf
        n = view.len
        if n >= 40:
            stored = tq_u32(p + 8)
            at = _body_len_pos(tq_i32(p + 36))
            if at + 4 <= n:
                body_len = tq_i32(p + at)
                at += 4
                if body_len >= 0 and body_len <= n - at:
                    ok = (_crc_mem(p + at, body_len) & 0x7FFFFFFF) == stored
    finally:
        PyBuffer_Release(&view)
    return ok


def record_mismatch(record, size, topic, queue_id, queue_offset):
    """Why ``record`` is not the one a queue entry names, None if it is (:func:`tidemq.record.record_mismatch`)."""
    cdef Py_buffer view
    cdef int64_t s, qid, qoff
    cdef bint ok
    if not _bound:
        _bind()
    if (
        not PyBytes_CheckExact(topic)
        or not PyLong_CheckExact(size) or _as_i64(size, &s) != 0
        or not PyLong_CheckExact(queue_id) or _as_i64(queue_id, &qid) != 0
        or not PyLong_CheckExact(queue_offset) or _as_i64(queue_offset, &qoff) != 0
        or _get_buffer(record, &view, PyBUF_SIMPLE) < 0
    ):
        return _ref.record_mismatch(record, size, topic, queue_id, queue_offset)
    try:
        ok = _entry_matches(
            <const uint8_t *>view.buf, view.len, s, qid, qoff,
            <const uint8_t *>PyBytes_AS_STRING(topic), PyBytes_GET_SIZE(topic),
        )
    finally:
        PyBuffer_Release(&view)
    if ok:
        return None
    why = _ref.record_mismatch(record, size, topic, queue_id, queue_offset)
    if why is None:
        _disagreed()
    return why


