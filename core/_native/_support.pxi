# Shared by every module of the compiled codec (tidemq._native._*.pyx, through `include`): the
# C-level reads and writes, slot access to the attrs message classes, CRC32, buffers and ints.
# Each module compiles its own copy: its own binding, CRC check and disagreement counter.

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_CheckExact, PyLong_FromLong, PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
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

try:  # the same function the reference uses (tidemq.message_types._crc32)
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
# tidemq.message and tidemq.message_types import these modules, so the classes and the reference
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

    import tidemq.message_types as message
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


