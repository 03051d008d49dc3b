# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""Compiled per-message codec (issue 19): the hot loops of :mod:`tidemq.record` in C.

Same names, arguments and results as the pure-Python reference in :mod:`tidemq.record` (and
:func:`tidemq.message.py_create_message_id`): :class:`RecordEncoder` (``prepare`` /
``write_into`` / ``message_id``), :func:`decode_batch`, :func:`decode_message`,
:func:`iter_messages`, :func:`record_crc_ok`, :func:`record_mismatch`, :func:`pack_cq_entries`
and :func:`create_message_id`.  :mod:`tidemq.message` hands these out when the module is built and
``TIDEMQ_NO_EXTENSIONS`` is not set.

Errors: the compiled code handles well-formed input and detects malformed input itself (every
read is checked against the buffer's length before it is made).  When it finds the input
malformed, or unusual in a way its fast path does not take (a field of another type, a value out
of its Java range, a string that does not encode...), it hands the same call to the reference
implementation, which raises its own exception (or returns its result).  So exception types and
messages are the reference's by construction; :func:`disagreements` counts the calls where the
reference accepted what the compiled code had refused (0 unless there is a bug: the differential
tests and the fuzzer check it).

CRC32: zlib-ng's SIMD ``zng_crc32``, called directly from the ``zlib_ng`` extension module the
reference uses (found with ``dlsym`` and checked against the Python call on known inputs at
import); through the Python call when that symbol is not there.  :data:`CRC32_SOURCE` says which.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_CheckExact, PyLong_FromLong, PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, memset

import struct as _struct

cdef extern from "Python.h":
    # Raw declarations: NULL / -1 are handled here, not turned into exceptions by Cython.
    PyObject *raw_decode_utf8 "PyUnicode_DecodeUTF8"(const char *s, Py_ssize_t size, const char *errors)
    PyObject *raw_as_utf8_string "PyUnicode_AsUTF8String"(PyObject *u)
    PyObject *raw_dict_get "PyDict_GetItemWithError"(object d, object key)
    PyObject *raw_memoryview "PyMemoryView_FromMemory"(char *mem, Py_ssize_t size, int flags)
    long long raw_as_ll "PyLong_AsLongLongAndOverflow"(object v, int *overflow)
    unsigned long long raw_as_ull_mask "PyLong_AsUnsignedLongLongMask"(object v)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void *PyUnicode_DATA(object u)
    bint PyUnicode_IS_COMPACT_ASCII(object u)
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    int PyUnicode_KIND(object u)
    Py_UCS4 PyUnicode_READ(int kind, void *data, Py_ssize_t index)
    PyObject *PyErr_Occurred()
    void PyErr_Clear()
    int PyBUF_READ
    PyTypeObject *Py_TYPE(object o)
    PyObject *PySequence_Fast_GET_ITEM(object o, Py_ssize_t i)
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include "structmember.h"

    /* Big-endian fields (shifts: right on any host; gcc turns them into bswap/movbe). */
    static inline uint32_t tq_u32(const uint8_t *p) {
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
    }
    static inline int32_t tq_i32(const uint8_t *p) { return (int32_t)tq_u32(p); }
    static inline int16_t tq_i16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
    static inline int64_t tq_i64(const uint8_t *p) {
        return (int64_t)(((uint64_t)tq_u32(p) << 32) | (uint64_t)tq_u32(p + 4));
    }
    static inline void tq_put32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
    }
    static inline void tq_put16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
    static inline void tq_put64(uint8_t *p, uint64_t v) {
        tq_put32(p, (uint32_t)(v >> 32)); tq_put32(p + 4, (uint32_t)v);
    }

    /* Slots of a Python class with __slots__ (attrs classes): read and set by member offset. */
    static Py_ssize_t tq_member_offset(PyObject *descr) {
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    static inline PyObject *tq_get_slot(PyObject *obj, Py_ssize_t off) {
        return *(PyObject **)((char *)obj + off);
    }
    static inline void tq_set_slot(PyObject *obj, Py_ssize_t off, PyObject *v) {
        PyObject **p = (PyObject **)((char *)obj + off);
        PyObject *old = *p;
        Py_INCREF(v);
        *p = v;
        Py_XDECREF(old);
    }
    static inline int tq_slot_long(PyObject *obj, Py_ssize_t off, long long v) {
        PyObject *x = PyLong_FromLongLong(v);
        if (x == NULL) return -1;
        PyObject **p = (PyObject **)((char *)obj + off);
        PyObject *old = *p;
        *p = x;
        Py_XDECREF(old);
        return 0;
    }
    static inline int tq_list_set_long(PyObject *list, Py_ssize_t i, long long v) {
        PyObject *x = PyLong_FromLongLong(v);
        if (x == NULL) return -1;
        PyList_SET_ITEM(list, i, x);  /* a fresh list: no old item */
        return 0;
    }
    static PyObject *tq_alloc(PyObject *type) {
        PyTypeObject *tp = (PyTypeObject *)type;
        return tp->tp_alloc(tp, 0);
    }

    /* zlib-ng's crc32, straight from the zlib_ng extension module already loaded. */
    typedef uint32_t (*tq_crc_fn)(uint32_t, const uint8_t *, uint32_t);
    static tq_crc_fn tq_zng_crc32 = NULL;
    #if defined(_WIN32)
    static int tq_find_zng(const char *path) { (void)path; return 0; }
    #else
    #include <dlfcn.h>
    static int tq_find_zng(const char *path) {
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (h == NULL) return 0;
        tq_zng_crc32 = (tq_crc_fn)dlsym(h, "zng_crc32");
        return tq_zng_crc32 != NULL;
    }
    #endif
    static uint32_t tq_crc_direct(const uint8_t *p, Py_ssize_t n) {
        uint32_t crc = 0;
        while (n > 0) {
            uint32_t chunk = n > 0x40000000 ? 0x40000000u : (uint32_t)n;
            crc = tq_zng_crc32(crc, p, chunk);
            p += chunk;
            n -= chunk;
        }
        return crc;
    }
    static inline int tq_add_overflows(int64_t a, int64_t b, int64_t *out) {
        return __builtin_add_overflow(a, b, out);
    }
    static inline int tq_mul_overflows(int64_t a, int64_t b, int64_t *out) {
        return __builtin_mul_overflow(a, b, out);
    }
    """
    uint32_t tq_u32(const uint8_t *p) nogil
    int32_t tq_i32(const uint8_t *p) nogil
    int16_t tq_i16(const uint8_t *p) nogil
    int64_t tq_i64(const uint8_t *p) nogil
    void tq_put32(uint8_t *p, uint32_t v) nogil
    void tq_put16(uint8_t *p, uint32_t v) nogil
    void tq_put64(uint8_t *p, uint64_t v) nogil
    Py_ssize_t tq_member_offset(PyObject *descr)
    PyObject *tq_get_slot(PyObject *obj, Py_ssize_t off)
    void tq_set_slot(PyObject *obj, Py_ssize_t off, PyObject *v)
    PyObject *tq_alloc(PyObject *type)
    int tq_slot_long(PyObject *obj, Py_ssize_t off, long long v) except -1
    int tq_list_set_long(object lst, Py_ssize_t i, long long v) except -1
    int tq_find_zng(const char *path)
    uint32_t tq_crc_direct(const uint8_t *p, Py_ssize_t n) nogil
    bint tq_add_overflows(int64_t a, int64_t b, int64_t *out) nogil
    bint tq_mul_overflows(int64_t a, int64_t b, int64_t *out) nogil


cdef enum:
    MAGIC = 0xDAA320A7
    BORN_V6 = 1 << 4
    STORE_V6 = 1 << 5
    V6_FLAGS = BORN_V6 | STORE_V6
    IPV4_BODY_POS = 84
    KEY_CACHE = 64     # property-key strings by their bytes (direct-mapped)
    KEY_MAX = 32
    HOST_CACHE = 4     # (ip, port) tuples by their 8 or 20 bytes
    TOPIC_CACHE = 4    # topic strings by their bytes
    TOPIC_MAX = 128

cdef struct cent_t:
    Py_ssize_t len
    PyObject *obj
    uint8_t data[TOPIC_MAX]


# ---------------------------------------------------------------------------- CRC32

cdef object _py_crc32 = None
cdef bint _crc_direct = False

try:  # the same function the reference uses (tidemq.message._crc32)
    import zlib_ng.zlib_ng as _zng

    _py_crc32 = _zng.crc32
    _zng_file = getattr(_zng, "__file__", None)
except ImportError:  # pragma: no cover - zlib-ng is a declared dependency
    import zlib as _zlib

    _py_crc32 = _zlib.crc32
    _zng_file = None


cdef bint _check_direct_crc():
    cdef bytes probe
    cdef Py_ssize_t size
    for size in (0, 1, 9, 31, 64, 255, 1000, 4096, 70001):
        probe = bytes([(i * 131 + 7) & 0xFF for i in range(size)])
        if tq_crc_direct(<const uint8_t *>PyBytes_AS_STRING(probe), size) != _py_crc32(probe):
            return False
    return True


if _zng_file is not None and tq_find_zng(_zng_file.encode()) and _check_direct_crc():
    _crc_direct = True
    CRC32_SOURCE = "zlib-ng direct"
elif _zng_file is not None:
    CRC32_SOURCE = "zlib-ng via Python"
else:  # pragma: no cover
    CRC32_SOURCE = "zlib via Python"


cdef inline uint32_t _crc_mem(const uint8_t *p, Py_ssize_t n) except? 0xFFFFFFFF:
    """CRC32 of ``n`` bytes at ``p`` (a buffer the caller holds)."""
    cdef PyObject *view
    if _crc_direct:
        return tq_crc_direct(p, n)
    view = raw_memoryview(<char *>p, n, PyBUF_READ)
    if view == NULL:
        raise MemoryError()
    obj = <object>view
    Py_DECREF(obj)
    return <uint32_t>(_py_crc32(obj) & 0xFFFFFFFF)


cdef inline uint32_t _crc_bytes(bytes body) except? 0xFFFFFFFF:
    if _crc_direct:
        return tq_crc_direct(<const uint8_t *>PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body))
    return <uint32_t>(_py_crc32(body) & 0xFFFFFFFF)


def _crc32_ns(bytes data, Py_ssize_t n, bint direct):
    """Nanoseconds per CRC32 of ``data``, direct or through the Python call (bench/codec_bench.py)."""
    import time

    cdef Py_ssize_t i
    cdef uint32_t acc = 0
    if direct and not _crc_direct:
        return None
    t = time.perf_counter_ns()
    if direct:
        for i in range(n):
            acc ^= tq_crc_direct(<const uint8_t *>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    else:
        for i in range(n):
            acc ^= <uint32_t>(_py_crc32(data) & 0xFFFFFFFF)
    return (time.perf_counter_ns() - t) / n


# ---------------------------------------------------------------------------- binding to the Python side
# tidemq.message imports this module (through tidemq._native), so the classes and the reference
# functions are looked up on first use, not at import.

cdef bint _bound = False
cdef object MessageExt = None
cdef object MessageInner = None
cdef object BatchItem = None
cdef object _host_bytes = None
cdef object _ip_address = None
cdef object _ref = None                  # tidemq.record
cdef object _ref_create_message_id = None
cdef Py_ssize_t _disagreements = 0

_EXT_FIELDS = (
    "topic", "body", "queue_id", "flag", "queue_offset", "commit_log_offset", "sys_flag",
    "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
    "prepared_transaction_offset", "properties", "body_crc", "store_size",
)
_INNER_FIELDS = (
    "topic", "body", "queue_id", "flag", "properties", "sys_flag", "born_timestamp", "born_host",
    "store_host", "reconsume_times", "prepared_transaction_offset",
)
_ITEM_FIELDS = ("body", "flag", "properties")

# Slot offsets, or -1 in [0] when the class cannot be built / read slot by slot (then the class
# is called / its attributes are read the ordinary way).
cdef Py_ssize_t _ext_off[16]
cdef Py_ssize_t _inner_off[11]
cdef Py_ssize_t _item_off[3]
_ext_off[0] = _inner_off[0] = _item_off[0] = -1  # until _bind() has checked the classes


cdef int _slot_offsets(cls, tuple names, Py_ssize_t *out) except -1:
    """Fill ``out`` with the slot offset of each attribute, or out[0] = -1 if unusable."""
    import attrs

    out[0] = -1
    try:
        fields = attrs.fields(cls)
    except Exception:
        return 0
    if tuple([f.name for f in fields]) != names or type(cls) is not type:
        return 0
    if any(f.validator is not None or f.converter is not None or not f.init for f in fields):
        return 0
    if hasattr(cls, "__attrs_post_init__") or hasattr(cls, "__attrs_pre_init__"):
        return 0
    if cls.__new__ is not object.__new__:
        return 0
    cdef Py_ssize_t i, off
    offsets = []
    for name in names:
        descr = None
        for klass in cls.__mro__:
            if name in klass.__dict__:
                descr = klass.__dict__[name]
                break
        off = tq_member_offset(<PyObject *>descr) if descr is not None else -1
        if off < 0:
            return 0
        offsets.append(off)
    sentinels = tuple([object() for _ in names])
    probe = cls(*sentinels)
    for i in range(len(names)):
        if tq_get_slot(<PyObject *>probe, offsets[i]) != <PyObject *>sentinels[i]:
            return 0
    for i in range(len(names)):
        out[i] = offsets[i]
    return 0


cdef int _bind() except -1:
    global _bound, MessageExt, MessageInner, BatchItem, _host_bytes, _ip_address, _ref
    global _ref_create_message_id
    import ipaddress

    import tidemq.message as message
    import tidemq.record as record

    MessageExt = message.MessageExt
    MessageInner = message.MessageInner
    BatchItem = message.BatchItem
    _host_bytes = message._host_bytes
    _ip_address = ipaddress.ip_address
    _ref = record
    _ref_create_message_id = message.py_create_message_id
    _slot_offsets(MessageExt, _EXT_FIELDS, _ext_off)
    _slot_offsets(MessageInner, _INNER_FIELDS, _inner_off)
    _slot_offsets(BatchItem, _ITEM_FIELDS, _item_off)
    _bound = True
    return 0


def disagreements():
    """Calls where the reference accepted input the compiled code refused (a bug when not 0)."""
    return _disagreements


def uses_slots():
    """Whether MessageExt / MessageInner / BatchItem are built and read slot by slot (for tests)."""
    if not _bound:
        _bind()
    return {"MessageExt": _ext_off[0] >= 0, "MessageInner": _inner_off[0] >= 0, "BatchItem": _item_off[0] >= 0}


cdef inline void _disagreed():
    global _disagreements
    _disagreements += 1


cdef inline object _new(cls):
    cdef PyObject *p = tq_alloc(<PyObject *>cls)
    if p == NULL:
        raise MemoryError()
    obj = <object>p
    Py_DECREF(obj)
    return obj


# ---------------------------------------------------------------------------- small helpers

cdef inline int _get_buffer(obj, Py_buffer *view, int flags):
    """0 with ``view`` filled, or -1 with no exception set (the caller hands over to the reference).

    Only byte buffers: the reference counts a memoryview of wider items by item, not by byte.
    """
    try:
        PyObject_GetBuffer(obj, view, flags)
    except Exception:
        return -1
    if view.itemsize != 1:
        PyBuffer_Release(view)
        return -1
    return 0


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


cdef inline int _as_i64(obj, int64_t *out):
    """0 with ``out`` set when ``obj`` is an int in the int64 range; 1 when out of it; 2 when no int."""
    cdef int overflow = 0
    cdef long long v
    if not isinstance(obj, int):
        return 2
    v = raw_as_ll(obj, &overflow)
    if overflow:
        return 1
    out[0] = v
    return 0


cdef inline bint _i32_ok(obj, int32_t *out):
    cdef int64_t v
    if _as_i64(obj, &v) != 0 or v < -2147483648 or v > 2147483647:
        return False
    out[0] = <int32_t>v
    return True


cdef int64_t _struct_q(obj) except? -1:
    """An int64 field the way struct packs 'q': struct.error for what it refuses."""
    cdef int64_t v = 0
    cdef int rc = _as_i64(obj, &v)
    if rc == 2:
        try:
            obj = obj.__index__()
        except Exception:
            raise _struct.error("required argument is not an integer") from None
        rc = _as_i64(obj, &v)
    if rc == 1:
        raise _struct.error("int too large to convert")
    return v


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

cdef inline Py_ssize_t _body_len_pos(int32_t sys_flag) noexcept nogil:
    if sys_flag & V6_FLAGS:
        return (48 + (20 if sys_flag & BORN_V6 else 8)) + 8 + (20 if sys_flag & STORE_V6 else 8) + 12
    return IPV4_BODY_POS


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


def scan_queue(entries, Py_ssize_t start, Py_ssize_t limit, file_view, int64_t file_from,
               int64_t readable, bytes topic, int64_t queue_id, int64_t first_queue_offset,
               Py_ssize_t max_count, int64_t max_bytes, bint check_crc, list buffers,
               list queue_offsets, int64_t total, list runs=None):
    """The pull path's walk of ConsumeQueue entries (:func:`tidemq.record.scan_queue`)."""
    cdef Py_buffer ev, fv
    cdef const uint8_t *e
    cdef const uint8_t *f
    cdef Py_ssize_t i = start, en
    cdef int64_t phy, pos, last_phy = -1, qoff, run_start = -1, run_end = -1
    cdef int32_t size
    cdef int stop = 0
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
                if PyList_GET_SIZE(buffers) and (
                    PyList_GET_SIZE(buffers) >= max_count or total + size > max_bytes
                ):
                    stop = 1
                    break
                pos = phy - file_from
                if pos < 0 or size < 0 or pos + size > readable:
                    stop = 2
                    break
                qoff = first_queue_offset + i // 20
                if not _entry_matches(f + pos, size, size, queue_id, qoff,
                                      <const uint8_t *>PyBytes_AS_STRING(topic), PyBytes_GET_SIZE(topic)):
                    stop = 2
                    break
                if check_crc and not _crc_ok_mem(f + pos, size):
                    stop = 2
                    break
                buffers.append(file_view[pos:pos + size])
                queue_offsets.append(qoff)
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
    if runs is not None and run_start >= 0:
        runs.append(file_view[run_start:run_end])
    return i, total, last_phy, stop


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
    uint8_t born[20]


cdef class PreparedRecords:
    """Records validated and sized by the compiled :meth:`RecordEncoder.prepare`.

    The public fields of :class:`tidemq.record.PreparedBatch`: ``sizes``, ``tags_codes``, ``total``.
    """

    cdef rec_t *recs
    cdef Py_ssize_t n           # records filled in (owning a body reference)
    cdef uint8_t *arena
    cdef Py_ssize_t arena_len
    cdef Py_ssize_t arena_cap
    cdef readonly list sizes
    cdef readonly list tags_codes
    cdef readonly Py_ssize_t total

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
            except _Fallback:
                pass
            except Exception:  # e.g. a born host that is no address: the reference raises it
                pass
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
        cdef object topic, props, born_host
        cdef PyTypeObject *inner_type = <PyTypeObject *>MessageInner
        cdef int32_t tags_code = 0, qid, flag, reconsume, h
        cdef int64_t sys_flag, born_ts, prepared
        cdef uint8_t born[20]
        cdef uint8_t topic_buf[128]
        cdef Py_ssize_t born_len = 0, topic_len = 0, pos
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
            tq_list_set_long(b.sizes, i, size)
            tq_list_set_long(b.tags_codes, i, tags_code)
            total += size
        b.total = total
        return b

    def write_into(self, target, pos, batch, queue_offset, physical_offset, store_timestamp,
                   queue_offset_step=1):
        """Pack the records at ``target[pos:]``; each record's physical offset (:meth:`tidemq.record.RecordEncoder.write_into`)."""
        cdef PreparedRecords b
        cdef Py_buffer view
        cdef Py_ssize_t at, i, n, buflen
        cdef int64_t qoff, phys, ts, step, last
        cdef uint8_t *d
        cdef rec_t *r
        cdef Py_ssize_t o
        if type(batch) is not PreparedRecords:
            return self.reference.write_into(
                target, pos, batch, queue_offset, physical_offset, store_timestamp, queue_offset_step
            )
        b = <PreparedRecords>batch
        n = b.n
        if n == 0:
            return []
        at = pos.__index__()
        # The fields struct would pack, checked before a byte is written.
        qoff = _struct_q(queue_offset)
        phys = _struct_q(physical_offset)
        ts = _struct_q(store_timestamp)
        if n > 1:
            step = _struct_q(queue_offset_step)
            if tq_mul_overflows(step, n - 1, &last) or tq_add_overflows(qoff, last, &last):
                raise _struct.error("int too large to convert")
            if tq_add_overflows(phys, b.total - b.recs[n - 1].size, &last):
                raise _struct.error("int too large to convert")
        else:
            step = 0
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
            offsets = PyList_New(n)
            d = <uint8_t *>view.buf + at
            for i in range(n):
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
        finally:
            PyBuffer_Release(&view)
        return offsets
