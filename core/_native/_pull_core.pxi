# The pull path's walk of ConsumeQueue entries, shared (through `include`) by _pull_walk.pyx
# (scan_queue: a view and a queue offset per record taken) and _pull_lane.pyx (walk: the record
# runs only, no Python object per message).  Include after _support.pxi and _fields.pxi.


cdef int _stored_tags(const uint8_t *r, Py_ssize_t n, const uint8_t **value, Py_ssize_t *value_len):
    """The TAGS property of the record at ``r`` (``n`` bytes), read in place.

    -1 when :func:`tidemq.record.decode_message` (``with_body=False``) would refuse the record (the
    store's careful path then handles it); 0 when it has no TAGS; 1 with ``value`` set.  Same
    reads as the decoder, and the properties as ``string_to_properties`` sees them: pieces split
    at 0x02, a key up to the first 0x01 (pairs without one, or with an empty key, ignored), the
    last TAGS wins, and the whole must be UTF-8.
    """
    cdef int32_t total, sys_flag, body_len
    cdef Py_ssize_t q, iplen, topic_len, i, j, k, stop
    cdef int16_t props_len
    cdef const uint8_t *sep
    cdef const uint8_t *nxt
    cdef int found = 0
    if n < 48:
        return -1
    total = tq_i32(r)
    if tq_u32(r + 4) != MAGIC or total < 48 or total > n:
        return -1
    sys_flag = tq_i32(r + 36)
    q = 48
    iplen = 16 if sys_flag & BORN_V6 else 4
    if q + iplen + 4 + 8 > total:
        return -1
    q += iplen + 4 + 8
    iplen = 16 if sys_flag & STORE_V6 else 4
    if q + iplen + 4 + 16 > total:
        return -1
    q += iplen + 4
    body_len = tq_i32(r + q + 12)
    q += 16
    if body_len < 0 or body_len > total - q:
        return -1
    q += body_len
    if q >= total:
        return -1
    topic_len = r[q]
    q += 1
    if q + topic_len + 2 > total:
        return -1
    if not _valid_utf8(r + q, topic_len):
        return -1
    q += topic_len
    props_len = tq_i16(r + q)
    q += 2
    if props_len < 0 or q + props_len != total:
        return -1
    stop = total
    i = q
    while i < stop:
        nxt = <const uint8_t *>memchr(r + i, 2, stop - i)
        j = (nxt - r) if nxt != NULL else stop
        if not _valid_utf8(r + i, j - i):
            return -1
        sep = <const uint8_t *>memchr(r + i, 1, j - i)
        if sep != NULL:
            k = sep - r
            if k - i == 4 and memcmp(r + i, b"TAGS", 4) == 0:
                value[0] = r + k + 1
                value_len[0] = j - k - 1
                found = 1
        i = j + 1
    return found


cdef inline bint _code_in(int64_t code, const int64_t *codes, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t x
    for x in range(n):
        if codes[x] == code:
            return True
    return False


cdef bint _tag_in(const uint8_t *v, Py_ssize_t vn, tuple names):
    cdef Py_ssize_t x
    cdef object b
    for x in range(PyTuple_GET_SIZE(names)):
        b = <object>PyTuple_GET_ITEM(names, x)
        if PyBytes_GET_SIZE(b) == vn and memcmp(PyBytes_AS_STRING(b), v, vn) == 0:
            return True
    return False


cdef tuple _walk(object entries, Py_ssize_t start, Py_ssize_t limit, object file_view,
                 int64_t file_from, int64_t readable, bytes topic, int64_t queue_id,
                 int64_t first_queue_offset, Py_ssize_t max_count, int64_t max_bytes,
                 bint check_crc, list buffers, list queue_offsets, int64_t total, list runs,
                 tuple tags):
    """:func:`tidemq.record.scan_queue`'s walk; ``buffers``/``queue_offsets`` may be None (then
    only counted).  Returns ``(index, count, total, last_phy, stop)``."""
    cdef Py_buffer ev, fv
    cdef const uint8_t *e
    cdef const uint8_t *f
    cdef const uint8_t *tag_value = NULL
    cdef Py_ssize_t i = start, en, n_codes = 0, x, tag_len = 0, count = 0
    cdef int64_t phy, pos, last_phy = -1, qoff, run_start = -1, run_end = -1
    cdef int64_t *codes = NULL
    cdef int32_t size
    cdef int stop = 0, has_tags
    cdef tuple names = None
    if buffers is not None:
        count = PyList_GET_SIZE(buffers)
    if tags is not None:
        if PyTuple_GET_SIZE(tags) != 2 or type(tags[0]) is not tuple or type(tags[1]) is not tuple:
            raise TypeError("tags must be a (codes, names) pair of tuples")
        names = <tuple>tags[1]
        for x in range(PyTuple_GET_SIZE(names)):
            if not PyBytes_CheckExact(<object>PyTuple_GET_ITEM(names, x)):
                raise TypeError("tag names must be bytes")
        n_codes = PyTuple_GET_SIZE(tags[0])
        codes = <int64_t *>PyMem_Malloc((n_codes if n_codes else 1) * sizeof(int64_t))
        if codes == NULL:
            raise MemoryError()
        try:
            for x in range(n_codes):
                codes[x] = _struct_q(tags[0][x])
        except BaseException:
            PyMem_Free(codes)
            raise
    try:
        if PyObject_GetBuffer(entries, &ev, PyBUF_SIMPLE) < 0:
            raise TypeError("entries must be a bytes-like buffer")
        try:
            if PyObject_GetBuffer(file_view, &fv, PyBUF_SIMPLE) < 0:
                raise TypeError("file_view must be a bytes-like buffer")
            try:
                e = <const uint8_t *>ev.buf
                en = ev.len
                f = <const uint8_t *>fv.buf
                if limit > en - en % 20:
                    limit = en - en % 20
                if readable > fv.len:
                    readable = fv.len
                while i < limit:
                    phy = tq_i64(e + i)
                    size = tq_i32(e + i + 8)
                    last_phy = phy
                    if size == 0x7FFFFFFF:
                        stop = 2
                        break
                    if count and (count >= max_count or total + size > max_bytes):
                        stop = 1
                        break
                    if codes != NULL and not _code_in(tq_i64(e + i + 12), codes, n_codes):
                        i += 20  # another tag: skipped on the entry alone, the record unread
                        continue
                    pos = phy - file_from
                    # pos > readable - size, not pos + size > readable: a damaged entry's offset
                    # near 2**63 must not wrap the sum past the check.
                    if pos < 0 or size < 0 or pos > readable or size > readable - pos:
                        stop = 2
                        break
                    qoff = first_queue_offset + i // 20
                    if not _entry_matches(f + pos, size, size, queue_id, qoff,
                                          <const uint8_t *>PyBytes_AS_STRING(topic), PyBytes_GET_SIZE(topic)):
                        stop = 2
                        break
                    if codes != NULL:
                        has_tags = _stored_tags(f + pos, size, &tag_value, &tag_len)
                        if has_tags < 0:  # unreadable: the careful path logs and skips it
                            stop = 2
                            break
                        if has_tags == 0 or not _tag_in(tag_value, tag_len, names):
                            i += 20  # a colliding tag code: not this subscription's tag
                            continue
                    if check_crc and not _crc_ok_mem(f + pos, size):
                        stop = 2
                        break
                    if buffers is not None:
                        buffers.append(file_view[pos:pos + size])
                    if queue_offsets is not None:
                        queue_offsets.append(qoff)
                    count += 1
                    total += size
                    i += 20
                    if runs is not None:
                        if pos != run_end:
                            if run_start >= 0:
                                runs.append(file_view[run_start:run_end])
                            run_start = pos
                        run_end = pos + size
            finally:
                PyBuffer_Release(&fv)
        finally:
            PyBuffer_Release(&ev)
    finally:
        PyMem_Free(codes)
    if runs is not None and run_start >= 0:
        runs.append(file_view[run_start:run_end])
    return i, count, total, last_phy, stop
