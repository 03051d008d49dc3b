# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The write path, compiled: :class:`RecordEncoder` (``prepare`` / ``write_into`` / ``message_id``)
and :func:`pack_cq_entries` (the ConsumeQueue entries of appended records).

The Python reference is :class:`tidemq.record.RecordEncoder` / :func:`tidemq.record.pack_cq_entries`;
:mod:`tidemq.message` picks these at import when this module is built.
"""

include "_support.pxi"
include "_fields.pxi"

from libc.errno cimport EINTR, EIO, errno
from posix.unistd cimport pwrite

import os as _os


# ---------------------------------------------------------------------------- record encoding

cdef struct rec_t:
    PyObject *body          # a strong reference (bytes)
    Py_ssize_t body_len
    Py_ssize_t size
    Py_ssize_t tail_off     # TOPICLENGTH .. properties, in the batch's arena
    Py_ssize_t tail_len
    int64_t born_ts
    int64_t prepared
    uint32_t crc
    int32_t queue_id
    int32_t flag
    int32_t sys_flag
    int32_t reconsume
    int32_t born_len        # 8 or 20
    int32_t tags            # the ConsumeQueue tags code (Java hashCode of TAGS, 0 without)
    uint8_t born[20]


cdef class PreparedRecords:
    """Records validated and sized by the compiled :meth:`RecordEncoder.prepare`.

    The public fields of :class:`tidemq.record.PreparedBatch`: ``sizes``, ``tags_codes``, ``total``.
    Beyond them, for the store's put (its columns read once, here, not again in Python):
    ``properties`` and ``sys_flags`` (each message's, as the dispatchers take them), ``uniform``
    (every message has the first one's topic and queue id) and, once :meth:`RecordEncoder.write_file`
    has placed the records, :meth:`cq_entries` and :meth:`RecordEncoder.put_result`.
    """

    cdef rec_t *recs
    cdef Py_ssize_t n           # records filled in (owning a body reference)
    cdef uint8_t *arena
    cdef Py_ssize_t arena_len
    cdef Py_ssize_t arena_cap
    cdef readonly list sizes
    cdef readonly list tags_codes
    cdef readonly Py_ssize_t total
    cdef readonly list properties
    cdef readonly list sys_flags
    cdef readonly bint uniform
    cdef int64_t phys0          # physical offset of the first record, once written (write_file)
    cdef bint placed

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.recs != NULL:
            for i in range(self.n):
                Py_XDECREF(self.recs[i].body)
            PyMem_Free(self.recs)
        PyMem_Free(self.arena)

    def __len__(self):
        return self.n

    def __repr__(self):
        return f"PreparedRecords({self.n} records, {self.total} bytes)"

    def cq_entries(self, tags=None):
        """The ConsumeQueue entries of the records once placed (:func:`pack_cq_entries` of their
        offsets, ``sizes`` and ``tags``, by default ``tags_codes``), back to back."""
        cdef bint own = tags is None or tags is self.tags_codes
        if not self.placed:
            raise ValueError("the records are not written yet")
        if not own and not self._tags_ok(tags):
            return pack_cq_entries(self._offsets(), self.sizes, tags)  # struct refuses it there
        packed = PyBytes_FromStringAndSize(NULL, 20 * self.n)
        self._pack_cq(<uint8_t *>PyBytes_AS_STRING(packed), tags, own)
        return packed

    def cq_entries_into(self, target, Py_ssize_t pos, tags=None):
        """:meth:`cq_entries` packed straight into ``target[pos:]`` (a writable buffer: the queue
        file's mapping) instead of a new bytes object; the bytes written, or -1 (nothing written)
        when a tags code is not a 64-bit int (:meth:`cq_entries` then gives the reference's error)."""
        cdef Py_buffer view
        cdef Py_ssize_t n = 20 * self.n
        cdef bint own = tags is None or tags is self.tags_codes
        if not self.placed:
            raise ValueError("the records are not written yet")
        if not own and not self._tags_ok(tags):
            return -1
        PyObject_GetBuffer(target, &view, PyBUF_WRITABLE)
        try:
            if pos < 0 or view.len - pos < n:
                raise ValueError(f"{n} bytes of entries do not fit at {pos} of a {view.len}-byte buffer")
            self._pack_cq(<uint8_t *>view.buf + pos, tags, own)
        finally:
            PyBuffer_Release(&view)
        return n

    cdef bint _tags_ok(self, tags):
        """Whether ``tags`` is a list of one exact int64 per record."""
        cdef Py_ssize_t i
        cdef int64_t tag
        if type(tags) is not list or PyList_GET_SIZE(tags) != self.n:
            return False
        for i in range(self.n):
            if (
                not PyLong_CheckExact(<object>PySequence_Fast_GET_ITEM(tags, i))
                or _as_i64(<object>PySequence_Fast_GET_ITEM(tags, i), &tag) != 0
            ):
                return False
        return True

    cdef void _pack_cq(self, uint8_t *out, tags, bint own):
        """The entries at ``out`` (``tags`` checked by :meth:`_tags_ok` unless ``own``)."""
        cdef Py_ssize_t i
        cdef int64_t phys = self.phys0, tag = 0
        for i in range(self.n):
            if own:
                tag = self.recs[i].tags
            else:
                _as_i64(<object>PySequence_Fast_GET_ITEM(tags, i), &tag)
            tq_put64(out, <uint64_t>phys)
            tq_put32(out + 8, <uint32_t>self.recs[i].size)
            tq_put64(out + 12, <uint64_t>tag)
            out += 20
            phys += self.recs[i].size

    cdef list _offsets(self):
        cdef Py_ssize_t i
        cdef int64_t phys = self.phys0
        offsets = PyList_New(self.n)
        for i in range(self.n):
            tq_list_set_long(offsets, i, phys)
            phys += self.recs[i].size
        return offsets

    cdef int reserve(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t cap = self.arena_cap
        cdef uint8_t *grown
        if self.arena_len + more <= cap:
            return 0
        while cap < self.arena_len + more:
            cap = cap * 2 if cap else 1024
        grown = <uint8_t *>PyMem_Realloc(self.arena, cap)
        if grown == NULL:
            raise MemoryError()
        self.arena = grown
        self.arena_cap = cap
        return 0


cdef class _Fallback(Exception):
    pass


cdef inline int _put_str(PreparedRecords b, s) except -1:
    """Append the UTF-8 of an exact str to the arena; _Fallback when it does not encode."""
    cdef PyObject *raw
    cdef Py_ssize_t n
    if PyUnicode_IS_COMPACT_ASCII(s):
        n = PyUnicode_GET_LENGTH(s)
        b.reserve(n)
        memcpy(b.arena + b.arena_len, PyUnicode_DATA(s), n)
        b.arena_len += n
        return 0
    raw = raw_as_utf8_string(<PyObject *>s)
    if raw == NULL:
        PyErr_Clear()
        raise _Fallback()
    enc = <bytes>raw
    Py_DECREF(enc)
    n = PyBytes_GET_SIZE(enc)
    b.reserve(n)
    memcpy(b.arena + b.arena_len, PyBytes_AS_STRING(enc), n)
    b.arena_len += n
    return 0


cdef int _pwrite_all(int fd, const uint8_t *buf, Py_ssize_t n, int64_t pos, Py_ssize_t *done) noexcept nogil:
    """``pwrite`` ``buf[done:n]`` at ``pos + done``, again after a short write or EINTR; 0, or
    the errno that stopped it (EIO for a write that makes no progress: never loop on it)."""
    cdef ssize_t w
    while done[0] < n:
        w = pwrite(fd, buf + done[0], n - done[0], pos + done[0])
        if w < 0:
            if errno == EINTR:
                continue
            return errno
        if w == 0:
            return EIO
        done[0] += w
    return 0


cdef class RecordEncoder:
    """The compiled :class:`tidemq.record.RecordEncoder`: same methods, same bytes.

    ``prepare`` validates and sizes the batch (CRC, properties string, hosts) and keeps it in C;
    ``write_into`` packs the records into the store's buffer.  Anything the fast path does not
    take (a message that is not a plain ``MessageInner``, a field out of its Java range, a limit
    exceeded...) goes to the reference encoder, ``self.reference``, whose batch, result or error
    is then returned.
    """

    cdef readonly bytes store_host_bytes
    cdef readonly bint store_v6
    cdef readonly str id_prefix
    cdef readonly object reference
    cdef object _max_size
    cdef Py_ssize_t _max
    cdef bint _max_ok
    cdef uint8_t _store[20]
    cdef Py_ssize_t _store_len
    cdef uint8_t *_wbuf         # write_file's records, packed before their pwrite
    cdef Py_ssize_t _wcap

    def __init__(self, store_host, max_size=4 * 1024 * 1024):
        if not _bound:
            _bind()
        self.reference = _ref.RecordEncoder(store_host, max_size)
        self.store_host_bytes = self.reference.store_host_bytes
        self.store_v6 = self.reference.store_v6
        self.id_prefix = self.reference.id_prefix
        self._store_len = len(self.store_host_bytes)
        memcpy(self._store, PyBytes_AS_STRING(self.store_host_bytes), self._store_len)
        self.max_size = max_size

    @property
    def max_size(self):
        return self._max_size

    @max_size.setter
    def max_size(self, value):
        cdef int64_t v = 0
        self.reference.max_size = value
        self._max_size = value
        self._max_ok = PyLong_CheckExact(value) and _as_i64(value, &v) == 0 and 0 <= v < (1 << 40)
        self._max = <Py_ssize_t>v if self._max_ok else 0

    def message_id(self, commit_log_offset):
        """Same as :func:`create_message_id` for this store host."""
        if not PyLong_CheckExact(commit_log_offset):
            return self.reference.message_id(commit_log_offset)
        return _hex_id(self.id_prefix, raw_as_ull_mask(commit_log_offset))

    def message_ids(self, commit_log_offsets):
        """:meth:`message_id` of each offset, as a tuple."""
        cdef Py_ssize_t i, n
        if type(commit_log_offsets) is not list and type(commit_log_offsets) is not tuple:
            return self.reference.message_ids(commit_log_offsets)
        n = len(commit_log_offsets)
        for i in range(n):
            if not PyLong_CheckExact(<object>PySequence_Fast_GET_ITEM(commit_log_offsets, i)):
                return self.reference.message_ids(commit_log_offsets)
        out = PyTuple_New(n)
        for i in range(n):
            s = _hex_id(self.id_prefix, raw_as_ull_mask(<object>PySequence_Fast_GET_ITEM(commit_log_offsets, i)))
            Py_INCREF(s)
            PyTuple_SET_ITEM(out, i, s)
        return out

    def prepare(self, msgs):
        """Validate and size ``msgs`` (:meth:`tidemq.record.RecordEncoder.prepare`)."""
        seq = msgs if type(msgs) is list or type(msgs) is tuple else list(msgs)
        if self._max_ok:
            try:
                return self._prepare(seq)
            except _Fallback:  # unusual, not wrong: the reference takes it its ordinary way
                pass
            except (UnicodeError, ValueError, TypeError):
                # Bad input met by a Python call of the fast path (a topic that does not encode,
                # a born host that is no address): the reference raises its own error, for the
                # first bad message in its order of checks, which need not be the one met here.
                # It should raise; when it accepts the batch, the compiled code refused valid input.
                batch = self.reference.prepare(seq)
                _disagreed()
                return batch
        return self.reference.prepare(seq)

    def _prepare_compiled(self, msgs):
        """``prepare`` without the hand-over: raises what made the fast path give up (tests)."""
        return self._prepare(list(msgs))

    cdef PreparedRecords _prepare(self, seq):
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i, size, total = 0
        cdef Py_ssize_t head = 48 + 8 + 4 + 8 + 4 + self._store_len  # all but BORNHOST, body, tail
        cdef Py_ssize_t max_size = self._max, max_record = self._max + 64 * 1024
        cdef Py_ssize_t tail_off = 0, tail_len = 0, props_start, props_len
        cdef PyObject *m
        # Strong references, as the reference's locals: an object compared by identity stays alive.
        cdef object last_topic = None, last_props = None, last_born = None
        cdef object topic, props, born_host, first_topic = None
        cdef int32_t first_qid = 0
        cdef PyTypeObject *inner_type = <PyTypeObject *>MessageInner
        cdef int32_t tags_code = 0, qid, flag, reconsume, h
        cdef int64_t sys_flag, born_ts, prepared
        cdef uint8_t born[20]
        cdef uint8_t topic_buf[128]
        cdef Py_ssize_t born_len = 0, topic_len = 0, pos, klen, vlen
        cdef uint8_t *at
        cdef rec_t *r
        cdef PyObject *key
        cdef PyObject *value
        cdef PyObject *tags
        cdef PreparedRecords b = PreparedRecords.__new__(PreparedRecords)
        if _inner_off[0] < 0:
            raise _Fallback()
        b.recs = <rec_t *>PyMem_Malloc((n if n > 0 else 1) * sizeof(rec_t))
        if b.recs == NULL:
            raise MemoryError()
        b.sizes = PyList_New(n)
        b.tags_codes = PyList_New(n)
        b.properties = PyList_New(n)
        b.sys_flags = PyList_New(n)
        b.uniform = True
        for i in range(n):
            m = PySequence_Fast_GET_ITEM(seq, i)
            if <PyTypeObject *>Py_TYPE(<object>m) != inner_type:
                raise _Fallback()
            body = <object>tq_get_slot(m, _inner_off[1]) if tq_get_slot(m, _inner_off[1]) != NULL else None
            if not PyBytes_CheckExact(body) or PyBytes_GET_SIZE(body) > max_size:
                raise _Fallback()
            if tq_get_slot(m, _inner_off[0]) == NULL or tq_get_slot(m, _inner_off[4]) == NULL:
                raise _Fallback()
            topic = <object>tq_get_slot(m, _inner_off[0])
            props = <object>tq_get_slot(m, _inner_off[4])
            if topic is not last_topic or props is not last_props:
                if topic is not last_topic:
                    if not PyUnicode_CheckExact(topic):
                        raise _Fallback()
                    if PyUnicode_IS_COMPACT_ASCII(topic):
                        topic_len = PyUnicode_GET_LENGTH(topic)
                        if topic_len > 127:
                            raise _Fallback()
                        memcpy(topic_buf, PyUnicode_DATA(topic), topic_len)
                    else:
                        raw = topic.encode()  # UnicodeEncodeError: the reference raises it
                        topic_len = PyBytes_GET_SIZE(raw)
                        if topic_len > 127:
                            raise _Fallback()
                        memcpy(topic_buf, PyBytes_AS_STRING(raw), topic_len)
                    if i == 0:
                        first_topic = topic
                    elif b.uniform and topic != first_topic:
                        b.uniform = False
                    last_topic = topic
                if not PyDict_CheckExact(props):
                    raise _Fallback()
                # tail: TOPICLENGTH, topic, PROPERTIESLENGTH, k\x01v\x02... (messageProperties2String)
                tail_off = b.arena_len
                b.reserve(1 + topic_len + 2)
                b.arena[b.arena_len] = <uint8_t>topic_len
                memcpy(b.arena + b.arena_len + 1, topic_buf, topic_len)
                b.arena_len += 1 + topic_len + 2
                props_start = b.arena_len
                pos = 0
                while PyDict_Next(props, &pos, &key, &value):
                    if not PyUnicode_CheckExact(<object>key) or not PyUnicode_CheckExact(<object>value):
                        raise _Fallback()  # the reference formats other types as Java would print them
                    if PyUnicode_IS_COMPACT_ASCII(<object>key) and PyUnicode_IS_COMPACT_ASCII(<object>value):
                        # The usual pair: one room check, two copies.
                        klen = PyUnicode_GET_LENGTH(<object>key)
                        vlen = PyUnicode_GET_LENGTH(<object>value)
                        if b.arena_len + klen + vlen + 2 > b.arena_cap:
                            b.reserve(klen + vlen + 2)
                        at = b.arena + b.arena_len
                        memcpy(at, PyUnicode_DATA(<object>key), klen)
                        at[klen] = 1
                        memcpy(at + klen + 1, PyUnicode_DATA(<object>value), vlen)
                        at[klen + 1 + vlen] = 2
                        b.arena_len += klen + vlen + 2
                        continue
                    _put_str(b, <object>key)
                    b.reserve(1)
                    b.arena[b.arena_len] = 1
                    b.arena_len += 1
                    _put_str(b, <object>value)
                    b.reserve(1)
                    b.arena[b.arena_len] = 2
                    b.arena_len += 1
                props_len = b.arena_len - props_start
                if props_len > 32767:
                    raise _Fallback()
                tq_put16(b.arena + props_start - 2, <uint32_t>props_len)
                tail_len = b.arena_len - tail_off
                tags = raw_dict_get(props, "TAGS")
                if tags == NULL:
                    if PyErr_Occurred() != NULL:
                        PyErr_Clear()
                        raise _Fallback()
                    tags_code = 0
                elif not PyUnicode_CheckExact(<object>tags):
                    raise _Fallback()
                else:
                    _java_hash(<object>tags, &tags_code)
                last_props = props
            if tq_get_slot(m, _inner_off[7]) == NULL:
                raise _Fallback()
            born_host = <object>tq_get_slot(m, _inner_off[7])
            if born_host is not last_born:
                packed, v6 = _host_bytes(born_host)
                born_len = PyBytes_GET_SIZE(packed)
                if born_len != (20 if v6 else 8):
                    raise _Fallback()
                memcpy(born, PyBytes_AS_STRING(packed), born_len)
                last_born = born_host
            size = head + born_len + PyBytes_GET_SIZE(body) + tail_len
            if size > max_record or PyBytes_GET_SIZE(body) > 0x7FFFFFFF:
                raise _Fallback()
            if (
                tq_get_slot(m, _inner_off[5]) == NULL
                or _as_i64(<object>tq_get_slot(m, _inner_off[5]), &sys_flag) != 0
                or tq_get_slot(m, _inner_off[2]) == NULL
                or not _i32_ok(<object>tq_get_slot(m, _inner_off[2]), &qid)
                or tq_get_slot(m, _inner_off[3]) == NULL
                or not _i32_ok(<object>tq_get_slot(m, _inner_off[3]), &flag)
                or tq_get_slot(m, _inner_off[6]) == NULL
                or _as_i64(<object>tq_get_slot(m, _inner_off[6]), &born_ts) != 0
                or tq_get_slot(m, _inner_off[9]) == NULL
                or not _i32_ok(<object>tq_get_slot(m, _inner_off[9]), &reconsume)
                or tq_get_slot(m, _inner_off[10]) == NULL
                or _as_i64(<object>tq_get_slot(m, _inner_off[10]), &prepared) != 0
            ):
                raise _Fallback()  # the reference packs it and struct refuses it
            if i == 0:
                first_qid = qid
            elif qid != first_qid:
                b.uniform = False
            value = tq_get_slot(m, _inner_off[5])
            Py_INCREF(<object>value)
            PyList_SET_ITEM(b.sys_flags, i, <object>value)
            Py_INCREF(props)
            PyList_SET_ITEM(b.properties, i, props)
            sys_flag &= ~(<int64_t>V6_FLAGS)
            if born_len == 20:
                sys_flag |= BORN_V6
            if self.store_v6:
                sys_flag |= STORE_V6
            if sys_flag < -2147483648 or sys_flag > 2147483647:
                raise _Fallback()
            r = &b.recs[i]
            r.crc = _crc_bytes(body) & 0x7FFFFFFF
            r.body = <PyObject *>body
            Py_INCREF(body)
            b.n = i + 1
            r.body_len = PyBytes_GET_SIZE(body)
            r.size = size
            r.tail_off = tail_off
            r.tail_len = tail_len
            r.born_ts = born_ts
            r.prepared = prepared
            r.queue_id = qid
            r.flag = flag
            r.sys_flag = <int32_t>sys_flag
            r.reconsume = reconsume
            r.born_len = <int32_t>born_len
            memcpy(r.born, born, born_len)
            r.tags = tags_code
            tq_list_set_long(b.sizes, i, size)
            tq_list_set_long(b.tags_codes, i, tags_code)
            total += size
        b.total = total
        return b

    cdef int _check_fields(self, PreparedRecords b, queue_offset, physical_offset, store_timestamp,
                           queue_offset_step, int64_t *out) except -1:
        """The int64 fields struct would pack (queue offset, physical offset, store time, step),
        checked before a byte is written: struct.error for what struct refuses."""
        cdef int64_t last, step
        cdef Py_ssize_t n = b.n
        out[0] = _struct_q(queue_offset)
        out[1] = _struct_q(physical_offset)
        out[2] = _struct_q(store_timestamp)
        if n > 1:
            step = _struct_q(queue_offset_step)
            if tq_mul_overflows(step, n - 1, &last) or tq_add_overflows(out[0], last, &last):
                raise _struct.error("int too large to convert")
            if tq_add_overflows(out[1], b.total - b.recs[n - 1].size, &last):
                raise _struct.error("int too large to convert")
        else:
            step = 0
        out[3] = step
        return 0

    cdef object _pack(self, PreparedRecords b, uint8_t *d, const int64_t *f):
        """Pack the records at ``d`` (``b.total`` bytes); their physical offsets, as a list."""
        cdef Py_ssize_t i, o
        cdef int64_t qoff = f[0], phys = f[1], ts = f[2], step = f[3]
        cdef rec_t *r
        offsets = PyList_New(b.n)
        for i in range(b.n):
            r = &b.recs[i]
            tq_put32(d, <uint32_t>r.size)
            tq_put32(d + 4, MAGIC)
            tq_put32(d + 8, r.crc)
            tq_put32(d + 12, <uint32_t>r.queue_id)
            tq_put32(d + 16, <uint32_t>r.flag)
            tq_put64(d + 20, <uint64_t>qoff)
            tq_put64(d + 28, <uint64_t>phys)
            tq_put32(d + 36, <uint32_t>r.sys_flag)
            tq_put64(d + 40, <uint64_t>r.born_ts)
            memcpy(d + 48, r.born, r.born_len)
            o = 48 + r.born_len
            tq_put64(d + o, <uint64_t>ts)
            o += 8
            memcpy(d + o, self._store, self._store_len)
            o += self._store_len
            tq_put32(d + o, <uint32_t>r.reconsume)
            tq_put64(d + o + 4, <uint64_t>r.prepared)
            tq_put32(d + o + 12, <uint32_t>r.body_len)
            o += 16
            memcpy(d + o, PyBytes_AS_STRING(<object>r.body), r.body_len)
            o += r.body_len
            memcpy(d + o, b.arena + r.tail_off, r.tail_len)
            tq_list_set_long(offsets, i, phys)
            d += r.size
            phys += r.size
            qoff += step
        return offsets

    def write_into(self, target, pos, batch, queue_offset, physical_offset, store_timestamp,
                   queue_offset_step=1):
        """Pack the records at ``target[pos:]``; each record's physical offset (:meth:`tidemq.record.RecordEncoder.write_into`)."""
        cdef PreparedRecords b
        cdef Py_buffer view
        cdef Py_ssize_t at, buflen
        cdef int64_t f[4]
        if type(batch) is not PreparedRecords:
            return self.reference.write_into(
                target, pos, batch, queue_offset, physical_offset, store_timestamp, queue_offset_step
            )
        b = <PreparedRecords>batch
        if b.n == 0:
            return []
        at = pos.__index__()
        self._check_fields(b, queue_offset, physical_offset, store_timestamp, queue_offset_step, f)
        PyObject_GetBuffer(target, &view, PyBUF_WRITABLE)
        try:
            buflen = view.len
            if at < 0:
                if at + buflen < 0:
                    raise _struct.error(f"offset {at} out of range for {buflen}-byte buffer")
                at += buflen
            if buflen - at < b.total:
                raise _struct.error(
                    f"pack_into requires a buffer of at least {b.total + at} bytes for packing "
                    f"{b.total} bytes at offset {at} (actual buffer size is {buflen})"
                )
            offsets = self._pack(b, <uint8_t *>view.buf + at, f)
        finally:
            PyBuffer_Release(&view)
        b.phys0 = f[1]
        b.placed = True
        return offsets

    def write_file(self, PreparedRecords batch not None, int fd, int64_t file_pos, queue_offset,
                   physical_offset, store_timestamp, queue_offset_step=1):
        """Pack the records as :meth:`write_into` does, then write them into file ``fd`` at
        ``file_pos`` (``pwrite``, repeated after a short write); their physical offsets.

        The store's put of a batch: one call for the packing and the write, in a buffer the
        encoder keeps.  An ``OSError`` (ENOSPC, EIO) leaves what ``pwrite`` wrote (the caller
        takes it back); nothing is written when a field is refused (``struct.error``).
        """
        cdef PreparedRecords b = batch
        cdef int64_t f[4]
        cdef Py_ssize_t n = b.total, done = 0, cap
        cdef uint8_t *grown
        cdef int err = 0
        if b.n == 0:
            return []
        self._check_fields(b, queue_offset, physical_offset, store_timestamp, queue_offset_step, f)
        if n > self._wcap:
            cap = max(n, 2 * self._wcap, 64 * 1024)
            grown = <uint8_t *>PyMem_Realloc(self._wbuf, cap)
            if grown == NULL:
                raise MemoryError()
            self._wbuf = grown
            self._wcap = cap
        offsets = self._pack(b, self._wbuf, f)
        if n <= _GIL_WRITE_MAX:
            # Kept for measurements (set_gil_write_max): with the GIL held, the key index's thread
            # cannot run beside the kernel's copy; measured, that cost more than the hand-over.
            err = _pwrite_all(fd, self._wbuf, n, file_pos, &done)
        else:
            with nogil:
                err = _pwrite_all(fd, self._wbuf, n, file_pos, &done)
        if err:
            raise OSError(err, _os.strerror(err))
        b.phys0 = f[1]
        b.placed = True
        return offsets

    def put_result(self, cls, status, PreparedRecords batch not None, queue_offset, store_timestamp):
        """``cls(status, wrote_offset, wrote_bytes, queue_offset, msg_ids, store_timestamp,
        message_count)`` (:class:`tidemq.store.PutResult`) of records placed by :meth:`write_file`
        or :meth:`write_into`, their message ids made here, the object built slot by slot."""
        cdef PreparedRecords b = batch
        cdef Py_ssize_t i
        cdef uint64_t phys
        cdef PyObject *p
        if not b.placed:
            raise ValueError("the records are not written yet")
        ids = PyTuple_New(b.n)
        phys = <uint64_t>b.phys0
        for i in range(b.n):
            s = _hex_id(self.id_prefix, phys)
            Py_INCREF(s)
            PyTuple_SET_ITEM(ids, i, s)
            phys += <uint64_t>b.recs[i].size
        if cls is not _put_cls:
            _bind_put_result(cls)
        if _put_off[0] < 0:
            return cls(
                status,
                wrote_offset=b.phys0,
                wrote_bytes=b.total,
                queue_offset=queue_offset,
                msg_ids=ids,
                store_timestamp=store_timestamp,
                message_count=b.n,
            )
        r = _new(cls)
        p = <PyObject *>r
        tq_set_slot(p, _put_off[0], <PyObject *>status)
        tq_slot_long(p, _put_off[1], b.phys0)
        tq_slot_long(p, _put_off[2], b.total)
        tq_set_slot(p, _put_off[3], <PyObject *>queue_offset)
        tq_set_slot(p, _put_off[4], <PyObject *>ids)
        tq_set_slot(p, _put_off[5], <PyObject *>store_timestamp)
        tq_slot_long(p, _put_off[6], b.n)
        tq_set_slot(p, _put_off[7], <PyObject *>"")
        return r

    def __dealloc__(self):
        PyMem_Free(self._wbuf)


#: Writes up to this size keep the GIL during their ``pwrite`` (RecordEncoder.write_file); 0:
#: every write lets other threads run, as ``os.pwrite`` does.
cdef Py_ssize_t _GIL_WRITE_MAX = 0

_PUT_FIELDS = (
    "status", "wrote_offset", "wrote_bytes", "queue_offset", "msg_ids", "store_timestamp",
    "message_count", "error",
)
cdef object _put_cls = None
cdef Py_ssize_t _put_off[8]
_put_off[0] = -1


cdef int _bind_put_result(cls) except -1:
    global _put_cls
    _slot_offsets(cls, _PUT_FIELDS, _put_off)
    _put_cls = cls
    return 0


def set_gil_write_max(Py_ssize_t n):
    """Writes of :meth:`RecordEncoder.write_file` up to ``n`` bytes keep the GIL (benchmarks)."""
    global _GIL_WRITE_MAX
    _GIL_WRITE_MAX = n


# ---------------------------------------------------------------------------- consume-queue entries

def pack_cq_entries(offsets, sizes, tags_codes):
    """The ConsumeQueue entries of appended records, back to back (:func:`tidemq.record.pack_cq_entries`)."""
    cdef Py_ssize_t i, n
    cdef int64_t offset, tags
    cdef int32_t size
    cdef uint8_t *out
    if not _bound:
        _bind()
    n = len(offsets) if type(offsets) is list or type(offsets) is tuple else -1
    if (
        n < 0
        or (type(sizes) is not list and type(sizes) is not tuple) or len(sizes) != n
        or (type(tags_codes) is not list and type(tags_codes) is not tuple) or len(tags_codes) != n
    ):
        return _ref.pack_cq_entries(offsets, sizes, tags_codes)
    packed = PyBytes_FromStringAndSize(NULL, 20 * n)
    out = <uint8_t *>PyBytes_AS_STRING(packed)
    for i in range(n):
        if (
            not PyLong_CheckExact(<object>PySequence_Fast_GET_ITEM(offsets, i))
            or _as_i64(<object>PySequence_Fast_GET_ITEM(offsets, i), &offset) != 0
            or not PyLong_CheckExact(<object>PySequence_Fast_GET_ITEM(sizes, i))
            or not _i32_ok(<object>PySequence_Fast_GET_ITEM(sizes, i), &size)
            or not PyLong_CheckExact(<object>PySequence_Fast_GET_ITEM(tags_codes, i))
            or _as_i64(<object>PySequence_Fast_GET_ITEM(tags_codes, i), &tags) != 0
        ):
            return _ref.pack_cq_entries(offsets, sizes, tags_codes)  # struct refuses it there
        tq_put64(out, <uint64_t>offset)
        tq_put32(out + 8, <uint32_t>size)
        tq_put64(out + 12, <uint64_t>tags)
        out += 20
    return packed


