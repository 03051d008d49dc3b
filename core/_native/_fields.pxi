# Shared by the modules of the compiled codec that read record fields (through `include`, after
# _support.pxi): strings and hosts (with their small caches), properties, Java hashes, the checks
# on a served record and the hex of message ids.

cdef inline object _utf8(const uint8_t *p, Py_ssize_t n):
    """Strict UTF-8 decode, or None (error cleared) when the bytes are not UTF-8."""
    cdef PyObject *r = raw_decode_utf8(<const char *>p, n, NULL)
    if r == NULL:
        PyErr_Clear()
        return None
    s = <object>r
    Py_DECREF(s)
    return s


cdef inline bint _valid_utf8(const uint8_t *p, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 0x80:
            return _utf8(p, n) is not None
    return True


cdef cent_t _keys[KEY_CACHE]
cdef cent_t _hosts[HOST_CACHE]
cdef cent_t _topics[TOPIC_CACHE]
cdef int _host_next = 0
cdef int _topic_next = 0


cdef inline void _cache_put(cent_t *e, const uint8_t *p, Py_ssize_t n, obj):
    cdef PyObject *old = e.obj
    Py_INCREF(obj)
    e.obj = <PyObject *>obj
    e.len = n
    memcpy(e.data, p, n)
    Py_XDECREF(old)


cdef inline object _key_str(const uint8_t *p, Py_ssize_t n):
    """A property key (keys repeat: one string per distinct key), or None when not UTF-8."""
    cdef cent_t *e
    if n == 0 or n > KEY_MAX:
        return _utf8(p, n)
    e = &_keys[(n * 131 + p[0] * 31 + p[n - 1]) & (KEY_CACHE - 1)]
    if e.len == n and e.obj != NULL and memcmp(e.data, p, n) == 0:
        return <object>e.obj
    s = _utf8(p, n)
    if s is not None:
        _cache_put(e, p, n, s)
    return s


cdef object _topic_str(const uint8_t *p, Py_ssize_t n):
    global _topic_next
    cdef int i
    cdef cent_t *e
    if n > TOPIC_MAX:
        return _utf8(p, n)
    for i in range(TOPIC_CACHE):
        e = &_topics[i]
        if e.len == n and e.obj != NULL and memcmp(e.data, p, n) == 0:
            return <object>e.obj
    s = _utf8(p, n)
    if s is not None:
        _cache_put(&_topics[_topic_next], p, n, s)
        _topic_next = (_topic_next + 1) % TOPIC_CACHE
    return s


cdef object _host_tuple(const uint8_t *p, Py_ssize_t iplen):
    """The (ip, port) of an address field: ``iplen`` (4 or 16) address bytes and a 4-byte port."""
    global _host_next
    cdef Py_ssize_t n = iplen + 4
    cdef int i
    cdef cent_t *e
    cdef char text[16]
    cdef Py_ssize_t k, pos = 0
    cdef unsigned int octet
    for i in range(HOST_CACHE):
        e = &_hosts[i]
        if e.len == n and e.obj != NULL and memcmp(e.data, p, n) == 0:
            return <object>e.obj
    if iplen == 4:  # dotted quad, as str(ipaddress.IPv4Address)
        for k in range(4):
            octet = p[k]
            if octet >= 100:
                text[pos] = <char>(48 + octet // 100)
                pos += 1
            if octet >= 10:
                text[pos] = <char>(48 + (octet // 10) % 10)
                pos += 1
            text[pos] = <char>(48 + octet % 10)
            pos += 1
            if k < 3:
                text[pos] = 46
                pos += 1
        ip = (<bytes>PyBytes_FromStringAndSize(text, pos)).decode("ascii")
    else:  # IPv6 text has rules of its own (zero runs, mapped IPv4): ipaddress's
        ip = str(_ip_address(PyBytes_FromStringAndSize(<const char *>p, 16)))
    host = (ip, <int>tq_i32(p + iplen))
    _cache_put(&_hosts[_host_next], p, n, host)
    _host_next = (_host_next + 1) % HOST_CACHE
    return host


cdef object _parse_props(const uint8_t *p, Py_ssize_t start, Py_ssize_t stop):
    """``string_to_properties(p[start:stop].decode())``, or None when the bytes are not UTF-8.

    The separators are ASCII, so the string splits where its bytes do, and the whole is valid
    UTF-8 exactly when each piece between separators is: every piece is decoded or checked.
    """
    cdef dict d = {}
    cdef Py_ssize_t i = start, j, k
    cdef const uint8_t *q
    cdef const uint8_t *sep
    if start >= stop:
        return d
    while True:
        q = <const uint8_t *>memchr(p + i, 2, stop - i)
        j = (q - p) if q != NULL else stop
        sep = <const uint8_t *>memchr(p + i, 1, j - i)
        if sep != NULL and sep - p > i:
            k = sep - p
            key = _key_str(p + i, k - i)
            if key is None:
                return None
            value = _utf8(p + k + 1, j - k - 1)
            if value is None:
                return None
            PyDict_SetItem(d, key, value)
        elif not _valid_utf8(p + i, j - i):
            return None
        if q == NULL:
            return d
        i = j + 1


cdef int _java_hash(s, int32_t *out) except -1:
    """Java's String.hashCode (UTF-16 code units) of a str; 1 when it has lone surrogates."""
    cdef int kind = PyUnicode_KIND(s)
    cdef void *data = PyUnicode_DATA(s)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s)
    cdef uint32_t h = 0
    cdef uint32_t c
    for i in range(n):
        c = PyUnicode_READ(kind, data, i)
        if c >= 0x10000:
            c -= 0x10000
            h = 31 * h + (0xD800 + (c >> 10))
            h = 31 * h + (0xDC00 + (c & 0x3FF))
        else:
            h = 31 * h + c
    out[0] = <int32_t>h
    return 0



# ---------------------------------------------------------------------------- served-record checks

cdef inline Py_ssize_t _body_len_pos(int32_t sys_flag) noexcept nogil:
    if sys_flag & V6_FLAGS:
        return (48 + (20 if sys_flag & BORN_V6 else 8)) + 8 + (20 if sys_flag & STORE_V6 else 8) + 12
    return IPV4_BODY_POS



cdef inline Py_ssize_t _slice_bound(int64_t i, Py_ssize_t n) noexcept nogil:
    """A slice bound the way Python clips it (negative counts from the end)."""
    if i < 0:
        i += n
        if i < 0:
            return 0
    elif i > n:
        return n
    return <Py_ssize_t>i


cdef bint _entry_matches(const uint8_t *d, Py_ssize_t n, int64_t size, int64_t queue_id,
                         int64_t queue_offset, const uint8_t *topic, Py_ssize_t topic_len) noexcept:
    """Whether the reference's record_mismatch returns None (same reads, same Python indexing)."""
    cdef int64_t at, idx, body_len
    cdef Py_ssize_t a, b, length
    if n < 40 or tq_u32(d + 4) != MAGIC or tq_i32(d) != size:
        return False
    if tq_i32(d + 12) != queue_id or tq_i64(d + 20) != queue_offset:
        return False
    at = _body_len_pos(tq_i32(d + 36))
    if at + 4 > n:
        return False
    body_len = tq_i32(d + at)
    at += 4 + body_len  # may be negative: record[at] then counts from the end, as in Python
    idx = at + n if at < 0 else at
    if idx < 0 or idx >= n:
        return False
    a = _slice_bound(at + 1, n)
    b = _slice_bound(at + 1 + d[idx], n)
    length = b - a if b > a else 0
    return length == topic_len and memcmp(d + a, topic, length) == 0



cdef inline bint _crc_ok_mem(const uint8_t *p, Py_ssize_t n) except? -1:
    """record_crc_ok on raw bytes (same reads as the Python function)."""
    cdef Py_ssize_t at
    cdef int32_t body_len
    if n < 40:
        return False
    at = _body_len_pos(tq_i32(p + 36))
    if at + 4 > n:
        return False
    body_len = tq_i32(p + at)
    at += 4
    if body_len < 0 or body_len > n - at:
        return False
    return (_crc_mem(p + at, body_len) & 0x7FFFFFFF) == tq_u32(p + 8)


# ---------------------------------------------------------------------------- message ids

cdef object _hex_id(str prefix, uint64_t offset):
    """``prefix`` (ASCII) followed by ``offset`` as 16 upper-case hex digits."""
    cdef Py_ssize_t plen = PyUnicode_GET_LENGTH(prefix), i
    s = PyUnicode_New(plen + 16, 127)
    cdef uint8_t *out = <uint8_t *>PyUnicode_DATA(s)
    memcpy(out, PyUnicode_DATA(prefix), plen)
    for i in range(16):
        out[plen + 15 - i] = b"0123456789ABCDEF"[offset & 15]
        offset >>= 4
    return s


