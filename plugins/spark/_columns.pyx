# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False
"""Compiled column builder of the Spark sources: CommitLog records straight into Arrow buffers.

:func:`scan` walks consecutive RocketMQ 4.x records (a PULL_MESSAGE response body, or a mapped
CommitLog file) and appends each *plain* record to the column buffers of
:class:`tidemq_spark.schema.BatchBuilder` (a list of ``bytearray`` s, layout in ``schema.py``)
without creating a message object.  It never raises on malformed input: at the first record it
does not take (malformed, truncated, compressed, IPv6 hosts, a duplicate property key, the end of
a file...) it returns that position with :data:`NEEDS_REFERENCE`, and the caller hands the record
to the pure-Python reference (``decode_message`` + ``BatchBuilder.add``), which decides what
happens (a row, a skip, or its usual error).  So rows, errors and skips are the reference's by
construction; ``tests/test_spark_read_path.py`` checks the two byte-equal and fuzzes this loop.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memchr, memcmp, memcpy

cdef extern from "Python.h":
    PyObject *raw_decode_utf8 "PyUnicode_DecodeUTF8"(const char *s, Py_ssize_t size, const char *errors)
    void PyErr_Clear()
    void Py_DECREF(PyObject *o)
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ

#: :func:`scan` stopped at the end of the buffer or at ``max_rows``.
DONE = 0
#: :func:`scan` stopped at a record the reference must handle.
NEEDS_REFERENCE = 1

#: Modes: a pull response (records up to the end) or a CommitLog file (transactions, topics).
MODE_PULL = 0
MODE_STORE = 1

cdef uint32_t MAGIC = 0xDAA320A7
cdef int32_t SKIP_FLAGS = 1 | (1 << 4) | (1 << 5)  # compressed, IPv6 born host, IPv6 store host
cdef int32_t TX_MASK = 3 << 2
cdef int32_t TX_PREPARED = 1 << 2
cdef int32_t TX_ROLLBACK = 3 << 2
cdef int64_t TS_LIMIT = 9223372036854775  # |ms| above this overflows microseconds
cdef Py_ssize_t OFFSET_LIMIT = 2147483647  # Arrow's int32 offsets
# The column buffers' order (schema.py's BUF_* constants say the same).
cdef enum:
    MAX_PAIRS = 64
    MAX_CHOICES = 256
    B_TOPIC = 0
    B_TOPIC_OFF = 1
    B_QID = 2
    B_QOFF = 3
    B_ID = 4
    B_ID_OFF = 5
    B_TAGS = 6
    B_TAGS_OFF = 7
    B_TAGS_VALID = 8
    B_KEYS = 9
    B_KEYS_OFF = 10
    B_KEYS_VALID = 11
    B_BODY = 12
    B_BODY_OFF = 13
    B_PROP_OFF = 14
    B_PK = 15
    B_PK_OFF = 16
    B_PV = 17
    B_PV_OFF = 18
    B_BORN = 19
    B_STORE = 20
    B_RECON = 21
    N_BUFS = 22


cdef const char *HEX = b"0123456789ABCDEF"


cdef inline int32_t _i32(const uint8_t *p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


cdef inline uint32_t _u32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int64_t _i64(const uint8_t *p) noexcept nogil:
    return <int64_t>((<unsigned long long>_u32(p) << 32) | _u32(p + 4))


cdef inline int16_t _i16(const uint8_t *p) noexcept nogil:
    return <int16_t>((<unsigned int>p[0] << 8) | p[1])


cdef bint _utf8_ok(const uint8_t *p, Py_ssize_t n):
    """Whether ``bytes.decode()`` (strict UTF-8) accepts these bytes."""
    cdef Py_ssize_t i
    cdef PyObject *s
    for i in range(n):
        if p[i] >= 0x80:
            break
    else:
        return True
    s = raw_decode_utf8(<const char *>p, n, b"strict")
    if s == NULL:
        PyErr_Clear()
        return False
    Py_DECREF(s)
    return True


cdef struct Col:
    # One column buffer while a scan writes it: the bytearray grows geometrically here and is cut
    # to ``size`` at the end, instead of one PyByteArray_Resize per value.
    PyObject *ba
    char *data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _open(Col *c, bytearray ba) except -1:
    c.ba = <PyObject *>ba
    c.size = PyByteArray_GET_SIZE(ba)
    c.cap = c.size
    c.data = PyByteArray_AS_STRING(ba)
    return 0


cdef int _reserve(Col *c, Py_ssize_t n) except -1:
    cdef Py_ssize_t cap = c.cap * 2
    if cap < c.size + n:
        cap = c.size + n
    if cap < 1024:
        cap = 1024
    PyByteArray_Resize(<object>c.ba, cap)
    c.data = PyByteArray_AS_STRING(<object>c.ba)
    c.cap = cap
    return 0


cdef inline int _put(Col *c, const void *p, Py_ssize_t n) except -1:
    if c.size + n > c.cap:
        _reserve(c, n)
    memcpy(c.data + c.size, p, n)
    c.size += n
    return 0


cdef inline int _put_i32(Col *c, int32_t v) except -1:
    return _put(c, &v, 4)


cdef inline int _put_i64(Col *c, int64_t v) except -1:
    return _put(c, &v, 8)


cdef inline int _put_str(Col *data, Col *off, const void *p, Py_ssize_t n) except -1:
    _put(data, p, n)
    return _put_i32(off, <int32_t>data.size)


cdef struct Choices:
    Py_ssize_t count
    const char *text[MAX_CHOICES]
    Py_ssize_t size[MAX_CHOICES]


cdef int _choices(tuple items, Choices *out) except -1:
    """A tuple of bytes as C pointers (the tuple outlives the scan, so they stay valid)."""
    cdef Py_ssize_t i
    if len(items) > MAX_CHOICES:
        raise ValueError(f"at most {MAX_CHOICES} names to match, got {len(items)}")
    out.count = len(items)
    for i in range(out.count):
        if not isinstance(items[i], bytes):
            raise TypeError("names to match must be bytes")
        out.text[i] = PyBytes_AS_STRING(items[i])
        out.size[i] = PyBytes_GET_SIZE(items[i])
    return 0


cdef inline bint _in(const uint8_t *p, Py_ssize_t n, const Choices *c) noexcept nogil:
    """Whether the bytes equal one of the choices."""
    cdef Py_ssize_t i
    for i in range(c.count):
        if c.size[i] == n and (n == 0 or (c.text[i][0] == p[0] and memcmp(c.text[i], p, n) == 0)):
            return True
    return False


def scan(
    buf,
    Py_ssize_t pos,
    list cols,
    int mode,
    int64_t end_offset,
    tags,
    topics,
    tuple system_keys,
    Py_ssize_t max_rows,
    crc,
):
    """Append the plain records of ``buf`` from ``pos`` to ``cols``: ``(pos, rows, code)``.

    ``end_offset``: records with a queue offset at or past it are skipped (a pull's range end).
    ``tags``: a tuple of UTF-8 tag names a record's TAGS must be one of, or None (no filter).
    ``topics``: a tuple of UTF-8 topic names to keep, or None.  ``crc``: None, or a callable
    giving a body's masked CRC32 (``validateCrc``).  ``code`` is :data:`DONE` or
    :data:`NEEDS_REFERENCE` (the record at ``pos`` is the reference's to handle).
    """
    cdef Py_buffer view
    cdef const uint8_t *data
    cdef const uint8_t *r
    cdef const uint8_t *q
    cdef const uint8_t *sep
    cdef Py_ssize_t n, rows = 0, code = DONE
    cdef Py_ssize_t total, body_len, topic_len, props_len, p, props_at, i, j, k, piece_end, npairs
    cdef int32_t sys_flag, crc_field
    cdef int64_t queue_offset, born, stored
    cdef Py_ssize_t kpos[MAX_PAIRS]
    cdef Py_ssize_t klen[MAX_PAIRS]
    cdef Py_ssize_t vpos[MAX_PAIRS]
    cdef Py_ssize_t vlen[MAX_PAIRS]
    cdef Py_ssize_t uniq, tag, keys, nprops
    cdef char idbuf[32]
    cdef bint store = mode == MODE_STORE, dup
    cdef Col c[N_BUFS]
    cdef Py_ssize_t opened = 0
    cdef int32_t nprop_total
    cdef Choices sys_c, tags_c, topics_c
    _choices(system_keys, &sys_c)
    _choices(tags if tags is not None else (), &tags_c)
    _choices(topics if topics is not None else (), &topics_c)
    if len(cols) != N_BUFS:
        raise ValueError(f"scan needs {N_BUFS} column buffers, got {len(cols)}")
    for i in range(N_BUFS):
        if type(cols[i]) is not bytearray:
            raise TypeError("column buffers must be bytearrays")
    if PyByteArray_GET_SIZE(cols[B_PROP_OFF]) < 4:
        raise ValueError("column buffers without their leading offset")
    p_off = cols[B_PROP_OFF]
    nprop_total = (<int32_t *>(PyByteArray_AS_STRING(p_off) + PyByteArray_GET_SIZE(p_off) - 4))[0]
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        for opened in range(N_BUFS):
            _open(&c[opened], cols[opened])
        opened = N_BUFS
        data = <const uint8_t *>view.buf
        n = view.len
        if pos < 0:
            return pos, 0, NEEDS_REFERENCE
        while rows < max_rows:
            if pos >= n:
                break
            if n - pos < 88:
                code = NEEDS_REFERENCE
                break
            r = data + pos
            total = _i32(r)
            if _u32(r + 4) != MAGIC or total < 88 or total > n - pos:
                code = NEEDS_REFERENCE
                break
            sys_flag = _i32(r + 36)
            if sys_flag & SKIP_FLAGS:
                code = NEEDS_REFERENCE
                break
            body_len = _i32(r + 84)
            if body_len < 0 or body_len > total - 88 - 1:
                code = NEEDS_REFERENCE
                break
            p = 88 + body_len
            topic_len = r[p]
            p += 1
            if p + topic_len + 2 > total:
                code = NEEDS_REFERENCE
                break
            props_len = _i16(r + p + topic_len)
            props_at = p + topic_len + 2
            if props_len < 0 or props_at + props_len != total:
                code = NEEDS_REFERENCE
                break
            if not _utf8_ok(r + p, topic_len) or not _utf8_ok(r + props_at, props_len):
                code = NEEDS_REFERENCE
                break
            if crc is not None:
                crc_field = _i32(r + 8)
                if crc(PyMemoryView_FromMemory(<char *>(r + 88), body_len, PyBUF_READ)) != crc_field:
                    code = NEEDS_REFERENCE
                    break
            born = _i64(r + 40)
            stored = _i64(r + 56)
            if born > TS_LIMIT or born < -TS_LIMIT or stored > TS_LIMIT or stored < -TS_LIMIT:
                code = NEEDS_REFERENCE
                break
            # Properties: k\x01v pairs separated by \x02; pieces without \x01 or with an empty key
            # are ignored (string_to_properties).  A repeated key goes to the reference (a dict
            # keeps the first position and the last value).
            npairs = 0
            dup = False
            i = props_at
            while i < total:
                q = <const uint8_t *>memchr(r + i, 2, total - i)
                piece_end = (q - r) if q != NULL else total
                sep = <const uint8_t *>memchr(r + i, 1, piece_end - i)
                if sep != NULL and (sep - r) > i:
                    if npairs == MAX_PAIRS:
                        dup = True
                        break
                    k = sep - r
                    kpos[npairs] = i
                    klen[npairs] = k - i
                    vpos[npairs] = k + 1
                    vlen[npairs] = piece_end - k - 1
                    for j in range(npairs):
                        if klen[j] == klen[npairs] and memcmp(r + kpos[j], r + i, klen[j]) == 0:
                            dup = True
                            break
                    if dup:
                        break
                    npairs += 1
                i = piece_end + 1
            if dup:
                code = NEEDS_REFERENCE
                break
            if (
                c[B_BODY].size + body_len > OFFSET_LIMIT
                or c[B_PV].size + props_len > OFFSET_LIMIT
                or c[B_PK].size + props_len > OFFSET_LIMIT
                or c[B_TOPIC].size + topic_len > OFFSET_LIMIT
                or c[B_ID].size + props_len + 32 > OFFSET_LIMIT
                or c[B_TAGS].size + props_len > OFFSET_LIMIT
                or c[B_KEYS].size + props_len > OFFSET_LIMIT
            ):
                code = NEEDS_REFERENCE  # the reference says the batch is too large
                break
            queue_offset = _i64(r + 20)
            # The record is valid: from here on it is either skipped or becomes a row.
            if store:
                if (sys_flag & TX_MASK) == TX_PREPARED or (sys_flag & TX_MASK) == TX_ROLLBACK:
                    pos += total
                    continue
                if topics is not None and not _in(r + p, topic_len, &topics_c):
                    pos += total
                    continue
            elif queue_offset >= end_offset:
                pos += total
                continue
            uniq = tag = keys = -1
            for j in range(npairs):
                if klen[j] == 8 and memcmp(r + kpos[j], b"UNIQ_KEY", 8) == 0:
                    uniq = j
                elif klen[j] == 4 and memcmp(r + kpos[j], b"TAGS", 4) == 0:
                    tag = j
                elif klen[j] == 4 and memcmp(r + kpos[j], b"KEYS", 4) == 0:
                    keys = j
            if tags is not None and (tag < 0 or not _in(r + vpos[tag], vlen[tag], &tags_c)):
                pos += total
                continue
            _put_str(&c[B_TOPIC], &c[B_TOPIC_OFF], r + p, topic_len)
            _put_i32(&c[B_QID], _i32(r + 12))
            _put_i64(&c[B_QOFF], queue_offset)
            if uniq >= 0 and vlen[uniq] > 0:
                _put_str(&c[B_ID], &c[B_ID_OFF], r + vpos[uniq], vlen[uniq])
            else:  # the offset message id: store host (IPv4 + port) and commit-log offset in hex
                for j in range(8):
                    idbuf[2 * j] = HEX[r[64 + j] >> 4]
                    idbuf[2 * j + 1] = HEX[r[64 + j] & 15]
                    idbuf[16 + 2 * j] = HEX[r[28 + j] >> 4]
                    idbuf[16 + 2 * j + 1] = HEX[r[28 + j] & 15]
                _put_str(&c[B_ID], &c[B_ID_OFF], idbuf, 32)
            if tag >= 0:
                _put_str(&c[B_TAGS], &c[B_TAGS_OFF], r + vpos[tag], vlen[tag])
                _put(&c[B_TAGS_VALID], b"\x01", 1)
            else:
                _put_i32(&c[B_TAGS_OFF], <int32_t>c[B_TAGS].size)
                _put(&c[B_TAGS_VALID], b"\x00", 1)
            if keys >= 0:
                _put_str(&c[B_KEYS], &c[B_KEYS_OFF], r + vpos[keys], vlen[keys])
                _put(&c[B_KEYS_VALID], b"\x01", 1)
            else:
                _put_i32(&c[B_KEYS_OFF], <int32_t>c[B_KEYS].size)
                _put(&c[B_KEYS_VALID], b"\x00", 1)
            _put_str(&c[B_BODY], &c[B_BODY_OFF], r + 88, body_len)
            nprops = 0
            for j in range(npairs):
                if _in(r + kpos[j], klen[j], &sys_c):
                    continue
                _put_str(&c[B_PK], &c[B_PK_OFF], r + kpos[j], klen[j])
                _put_str(&c[B_PV], &c[B_PV_OFF], r + vpos[j], vlen[j])
                nprops += 1
            nprop_total += <int32_t>nprops
            _put_i32(&c[B_PROP_OFF], nprop_total)
            _put_i64(&c[B_BORN], born * 1000)
            _put_i64(&c[B_STORE], stored * 1000)
            _put_i32(&c[B_RECON], _i32(r + 72))
            rows += 1
            pos += total
    finally:
        PyBuffer_Release(&view)
        for i in range(opened):  # cut each buffer to what it holds (keeps its allocation)
            PyByteArray_Resize(<object>c[i].ba, c[i].size)
    return pos, rows, code
