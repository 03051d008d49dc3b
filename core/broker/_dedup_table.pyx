# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The duplicate window's key table, compiled (issue 37): 64-bit key hashes to objects.

Buckets of 8 slots (one 64-byte cache line) over a ring of keys in arrival order: one random
cache line per key when it is checked and recorded, none when it leaves (lazy deletion: see
:class:`HashTable`), no Python object per key.  A key hashing to 0 is stored as 1.  :mod:`tidemq.broker.dedup_table` holds the Python
reference with the same API and picks this one when it is built.
"""

cimport cython
from cpython cimport array
from cpython.dict cimport PyDict_GetItem
from cpython.pycapsule cimport PyCapsule_New
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.set cimport PySet_Add, PySet_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset


cdef extern from *:
    void __builtin_prefetch(const void* addr) noexcept nogil


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    /* A table of at least 2 MiB lives in its own mapping, 2 MiB-aligned and advised to the
       kernel as huge pages (transparent huge pages in "madvise" mode, the common default): a
       full window's table is tens of MB, and on 4 KiB pages each random probe is a TLB miss
       too (a page walk of several dependent loads), not only a cache miss.  Returns the
       aligned block (zeroed) and its mapping in *base / *len, or NULL (then *len is 0: the
       caller uses calloc). */
    #define TIDEMQ_HUGE (2u << 20)
    static void* tidemq_huge_alloc(size_t size, void** base, size_t* len) {
        *base = NULL; *len = 0;
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        if (size < TIDEMQ_HUGE) return NULL;
        size_t want = size + TIDEMQ_HUGE;
        void* p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        uintptr_t at = ((uintptr_t)p + TIDEMQ_HUGE - 1) & ~(uintptr_t)(TIDEMQ_HUGE - 1);
        madvise((void*)at, size, MADV_HUGEPAGE);  /* advice only: 4 KiB pages if refused */
        *base = p; *len = want;
        return (void*)at;
    #else
        (void)size;
        return NULL;
    #endif
    }
    static void tidemq_huge_free(void* base, size_t len) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        if (len) munmap(base, len);
    #else
        (void)base; (void)len;
    #endif
    }
    """
    void* tidemq_huge_alloc(size_t size, void** base, size_t* length) noexcept nogil
    void tidemq_huge_free(void* base, size_t length) noexcept nogil


cdef extern from *:
    """
    /* The window's key hash (issue 37): 64 bits over a key's characters, keyed by four random
       64-bit secrets drawn once per process (as hash()'s SipHash key is), so a sender cannot
       choose keys that collide in the table.  The construction of wyhash / Go's runtime map hash
       (its fallback where AES is missing), keyed per process for the same reason (hash
       flooding): each 16 bytes folded by a 64x64->128-bit multiply of (word ^ secret) by
       (word ^ state), xor of the halves.  ~5 ns for a 32-character UNIQ_KEY, where hash()'s
       SipHash-1-3 took ~19 ns.  Not a cryptographic hash: a full 64-bit collision of two keys
       only sends the second to the handler's check, which compares bodies
       (DuplicateWindow.same_body).  dedup_table._py_key_hash is the same function in Python
       (the differential test). */
    static inline uint64_t tidemq_mum(uint64_t a, uint64_t b) {
        __uint128_t r = (__uint128_t)a * b;
        return (uint64_t)r ^ (uint64_t)(r >> 64);
    }
    static inline uint64_t tidemq_rd64(const unsigned char* p) {
        uint64_t v; memcpy(&v, p, 8); return v;  /* little-endian hosts (x86-64, aarch64) */
    }
    static uint64_t tidemq_key_hash(const unsigned char* p, size_t n, uint64_t tag, const uint64_t* s) {
        uint64_t state = s[0] ^ n ^ tag;
        unsigned char last[16];
        while (n > 16) {
            state = tidemq_mum(tidemq_rd64(p) ^ s[1], tidemq_rd64(p + 8) ^ state);
            p += 16; n -= 16;
        }
        memset(last, 0, 16);
        memcpy(last, p, n);
        state = tidemq_mum(tidemq_rd64(last) ^ s[1], tidemq_rd64(last + 8) ^ state);
        return tidemq_mum(state ^ s[2], s[3]);
    }
    """
    uint64_t tidemq_key_hash(const unsigned char* p, size_t n, uint64_t tag, const uint64_t* s) noexcept nogil


cdef extern from *:
    """
    /* Runs of keys (session 10): a key of 1-byte characters whose last 4 are hex digits of one
       case (0-9A-F, or 0-9a-f with a lower-case letter: another class, so ...000a and ...000A
       stay two keys) is split into its stem (the characters before) and the digits' value v.
       Its hash is the group's (stem, class, v >> TIDEMQ_GROUP_SHIFT: secret-keyed, in a domain
       of its own) with bit 63 set and the low TIDEMQ_GROUP_SHIFT bits replaced by v's: the keys
       of one group share every bit but those (so one fingerprint, one home bucket), and the hash
       is injective in v within a stem.  Any other key: the whole key hashed, bit 63 clear.
       RocketMQ 4.x's UNIQ_KEY ends in a 16-bit counter (4 hex digits), RocketMQ 5's message_id
       in a sequence, compare_load.py's in the message's index: a batch's keys count up, so 8 of
       them share one table slot (a "segment", HashTable) instead of taking 8. */
    #define TIDEMQ_RUN_BIT ((uint64_t)1 << 63)
    #define TIDEMQ_GROUP_SHIFT 3
    #define TIDEMQ_GROUP_LOW ((uint64_t)((1u << TIDEMQ_GROUP_SHIFT) - 1))
    static unsigned char tidemq_tailval[256];
    static void tidemq_tailval_init(void) {
        int c;
        for (c = 0; c < 256; c++) tidemq_tailval[c] = 0x80;
        for (c = 0; c < 10; c++) tidemq_tailval['0' + c] = (unsigned char)c;
        for (c = 0; c < 6; c++) {
            tidemq_tailval['A' + c] = (unsigned char)(0x20 | (10 + c));
            tidemq_tailval['a' + c] = (unsigned char)(0x40 | (10 + c));
        }
    }
    /* The last run key's stem and group hash: the next key of a batch counting up has the same
       stem (and mostly the same group), compared instead of hashed again (within one pass over
       a run's keys: p points into a key the run holds). */
    typedef struct { const unsigned char* p; size_t n; uint64_t tag; uint64_t g; } tidemq_stem_memo;
    static int tidemq_same(const unsigned char* a, const unsigned char* b, size_t n);
    static uint64_t tidemq_window_hash_m(const unsigned char* p, size_t n, int kind, const uint64_t* s,
                                         tidemq_stem_memo* m) {
        if (kind == 1 && n >= 4 && n <= 4096) {
            unsigned a = tidemq_tailval[p[n - 4]], b = tidemq_tailval[p[n - 3]];
            unsigned c = tidemq_tailval[p[n - 2]], d = tidemq_tailval[p[n - 1]];
            unsigned all = a | b | c | d;
            if (!(all & 0x80) && (all & 0x60) != 0x60) {
                unsigned v = ((a & 15) << 12) | ((b & 15) << 8) | ((c & 15) << 4) | (d & 15);
                uint64_t tag = ((uint64_t)1 << 56) | ((uint64_t)1 << 55)
                    | ((uint64_t)((all >> 6) & 1) << 54) | ((uint64_t)(v >> TIDEMQ_GROUP_SHIFT) << 16);
                uint64_t g;
                if (m != NULL && m->p != NULL && m->n == n && m->tag == tag && tidemq_same(m->p, p, n - 4)) {
                    g = m->g;
                } else {
                    g = tidemq_key_hash(p, n - 4, tag, s);
                    if (m != NULL) { m->p = p; m->n = n; m->tag = tag; m->g = g; }
                }
                return ((g | TIDEMQ_RUN_BIT) & ~TIDEMQ_GROUP_LOW) | (v & TIDEMQ_GROUP_LOW);
            }
        }
        return tidemq_key_hash(p, n, (uint64_t)kind << 56, s) & ~TIDEMQ_RUN_BIT;
    }
    static uint64_t tidemq_window_hash(const unsigned char* p, size_t n, int kind, const uint64_t* s) {
        return tidemq_window_hash_m(p, n, kind, s, NULL);
    }
    static inline int tidemq_popcount(uint32_t m) { return __builtin_popcount(m); }
    """
    ctypedef struct tidemq_stem_memo:
        const unsigned char* p
    uint64_t tidemq_window_hash(const unsigned char* p, size_t n, int kind, const uint64_t* s) noexcept nogil
    uint64_t tidemq_window_hash_m(const unsigned char* p, size_t n, int kind, const uint64_t* s,
                                  tidemq_stem_memo* m) noexcept nogil
    void tidemq_tailval_init() noexcept nogil
    int tidemq_popcount(uint32_t m) noexcept nogil
    uint64_t TIDEMQ_RUN_BIT
    uint64_t TIDEMQ_GROUP_LOW
    int TIDEMQ_GROUP_SHIFT


tidemq_tailval_init()


cdef extern from "Python.h":
    """
    #include "structmember.h"
    /* The byte offset of a __slots__ member holding an object (a member descriptor of
       T_OBJECT_EX, as attrs' slotted classes have), or -1. */
    static Py_ssize_t tidemq_slot_offset(PyObject* descr) {
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef* m = ((PyMemberDescrObject*)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & PY_AUDIT_READ)) return -1;
        return m->offset;
    }
    #define tidemq_slot_at(o, offset) (*(PyObject**)((char*)(o) + (offset)))
    """
    Py_ssize_t tidemq_slot_offset(PyObject* descr)
    PyObject* tidemq_slot_at(object o, Py_ssize_t offset)
    Py_ssize_t Py_SIZE(object o)
    PyObject* _PyType_Lookup(PyTypeObject* t, object name)  # borrowed, NULL when absent
    PyTypeObject* Py_TYPE(object o)
    Py_hash_t PyObject_Hash(object o) except -1
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    int PyObject_IS_GC(object o)
    void PyObject_GC_UnTrack(void* o)
    int PyUnicode_IS_ASCII(object o)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    unsigned char* PyUnicode_1BYTE_DATA(object o)


from tidemq.message import TRANSACTION_PREPARED_TYPE as _TX_PREPARED
from tidemq.message import TRANSACTION_ROLLBACK_TYPE as _TX_ROLLBACK
from tidemq.message import TRANSACTION_TYPE_MASK as _TX_MASK

#: The statuses (response codes) a first send may end with and still be stored: SUCCESS,
#: FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT.
STORED_CODES = frozenset((0, 10, 11, 12))

cdef array.array _Q = array.array("q")

import os as _os

cdef uint64_t _SECRET[4]
for _i, _word in enumerate(array.array("Q", _os.urandom(32))):
    _SECRET[_i] = <uint64_t>_word | 1  # odd: no secret is 0


cdef inline int64_t _hash_key(object key) noexcept:
    """``key``'s hash in the window (a str: its characters as CPython holds them, 1, 2 or 4
    bytes each, the width mixed in)."""
    cdef int kind = PyUnicode_KIND(key)
    return <int64_t>tidemq_window_hash(
        <const unsigned char*>PyUnicode_DATA(key),
        <size_t>(PyUnicode_GET_LENGTH(key) * kind),
        kind,
        _SECRET,
    )


cdef inline int64_t _hash_key_m(object key, tidemq_stem_memo* memo) noexcept:
    """:func:`_hash_key`, the stem of a run key compared with the last one's (``memo``)."""
    cdef int kind = PyUnicode_KIND(key)
    return <int64_t>tidemq_window_hash_m(
        <const unsigned char*>PyUnicode_DATA(key),
        <size_t>(PyUnicode_GET_LENGTH(key) * kind),
        kind,
        _SECRET,
        memo,
    )


def key_hash(str key not None):
    """A key's 64-bit hash in the window (what the tables are keyed by in this process)."""
    return _hash_key(key)


def hashes_of(list keys not None):
    """The keys' (a list of str) hashes, packed: what a record keeps."""
    cdef Py_ssize_t n = len(keys)
    cdef Py_ssize_t i
    cdef array.array hashes = array.clone(_Q, n, False)
    for i in range(n):
        key = keys[i]
        if type(key) is not str:
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        hashes.data.as_longlongs[i] = _hash_key(key)
    return hashes


def group_shift():
    """Bits of a run key's value that address its key within its group (8 keys a group)."""
    return TIDEMQ_GROUP_SHIFT


def secrets_for_tests():
    """This process's four secrets (tests/test_dedup_run.py checks the Python twin with them)."""
    return [_SECRET[i] for i in range(4)]
cdef array.array _D = array.array("d")


cdef inline Py_ssize_t _check_q(array.array hashes) except -1:
    """The number of hashes in an ``array("q")`` (anything else is refused: its items are read raw)."""
    if hashes.ob_descr.typecode != b"q":
        raise TypeError(f"expected an array('q') of key hashes, got typecode {hashes.typecode!r}")
    return Py_SIZE(hashes)


cdef inline uint64_t _slot_hash(int64_t h) noexcept:
    cdef uint64_t u = <uint64_t>h
    return u if u != 0 else 1


cdef struct Slot:
    uint32_t fp  # the key hash's high 31 bits (0 taken as 1): its fingerprint and home; 0: empty.
                 # Bit 31 of a bucket's first slot: the bucket's overflow flag (_OVER).
    uint32_t idx  # the key's entry in the table's ring (an absolute position)


cdef struct Entry:
    uint64_t hash  # the key's hash (not 0)
    PyObject* value  # a reference the table owns; NULL: a hole (the key left)


cdef inline uint32_t _fp(uint64_t h) noexcept:
    cdef uint32_t f = <uint32_t>(h >> 33)  # 31 bits: a slot's top bit is its bucket's flag
    return f if f != 0 else 1


cdef inline void _untrack(object o) noexcept:
    if PyObject_IS_GC(o):
        PyObject_GC_UnTrack(<void*>o)


def untrack(object o):
    """``o``, untracked by the cycle collector (an object that refers to no other: a record's
    hash array; ``array.array`` is a tracked type, and a full window of single sends holds
    500 000 of them, which every full collection walked)."""
    _untrack(o)
    return o


cdef extern from *:
    """
    /* Upper-case hex digits (only what "%016X" writes re-encodes byte-equal): a digit's value,
       else 0x80, OR-ed over a run so one test at the end finds any other byte. */
    static unsigned char tidemq_hexval[256];
    static void tidemq_hexval_init(void) {
        int c;
        for (c = 0; c < 256; c++) tidemq_hexval[c] = 0x80;
        for (c = 0; c < 10; c++) tidemq_hexval['0' + c] = (unsigned char)c;
        for (c = 0; c < 6; c++) tidemq_hexval['A' + c] = (unsigned char)(10 + c);
    }
    /* n hex digits at p into *out; 0, or -1 when one is not an upper-case hex digit. */
    static inline int tidemq_hex(const unsigned char* p, int n, uint64_t* out) {
        uint64_t v = 0;
        unsigned bad = 0;
        int i;
        for (i = 0; i < n; i++) {
            unsigned char d = tidemq_hexval[p[i]];
            bad |= d;
            v = (v << 4) | (d & 15);
        }
        *out = v;
        return (bad & 0x80) ? -1 : 0;
    }
    /* 8 upper-case hex digits at p into *out (SWAR: one load, no table, no chain through memory);
       0, or -1 when one is not an upper-case hex digit ("0-9A-F": what "%016X" writes). */
    static inline int tidemq_hex8(const unsigned char* p, uint64_t* out) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        const uint64_t ONES = 0x0101010101010101ULL, HI = 0x8080808080808080ULL;
        uint64_t x, digit, letter, v;
        memcpy(&x, p, 8);
        if (x & HI) return -1;  /* not ASCII (the adds below assume bytes < 0x80: no carries) */
        digit = ((x + ONES * (0x80 - 0x30)) & ~(x + ONES * (0x80 - 0x3A))) & HI;  /* '0'-'9' */
        letter = ((x + ONES * (0x80 - 0x41)) & ~(x + ONES * (0x80 - 0x47))) & HI;  /* 'A'-'F' */
        if ((digit | letter) != HI) return -1;
        v = (x & (ONES * 0x0F)) + (letter >> 7) * 9;  /* each byte its digit's value */
        v = __builtin_bswap64(v);  /* the first digit in the top byte */
        v = (v | (v >> 4)) & 0x00FF00FF00FF00FFULL;
        v = (v | (v >> 8)) & 0x0000FFFF0000FFFFULL;
        v = (v | (v >> 16)) & 0x00000000FFFFFFFFULL;
        *out = v;
        return 0;
    #else
        return tidemq_hex(p, 8, out);
    #endif
    }
    /* Whether n bytes at a and b are equal (inlined 8-byte loads: no libc call per id). */
    static inline int tidemq_same(const unsigned char* a, const unsigned char* b, size_t n) {
        uint64_t x, y;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) return 0;
        }
        for (; i < n; i++)
            if (a[i] != b[i]) return 0;
        return 1;
    }
    """
    int tidemq_same(const unsigned char* a, const unsigned char* b, size_t n) noexcept nogil
    void tidemq_hexval_init() noexcept nogil
    int tidemq_hex(const unsigned char* p, int n, uint64_t* out) noexcept nogil
    int tidemq_hex8(const unsigned char* p, uint64_t* out) noexcept nogil


tidemq_hexval_init()
cdef object _last_host = None  # the id prefix (store host) the last packed answer had: shared
cdef const char* _HEX = b"0123456789ABCDEF"


@cython.no_gc
cdef class SentFields:
    """The fields of one send's record in the window (``tidemq.broker.dedup_sent.Sent`` adds the
    methods): typed, so the compiled run and trim read and write them without attribute lookups.

    The answer's message ids are kept as numbers (``msg_id`` packs them when set): offset message
    ids of one put share their prefix (the store host: one str shared by every record) and differ
    in their last 16 hex digits (the commit-log offset), so a batch of 32 keeps the first offset
    and 31 32-bit deltas (~130 bytes) instead of a 1.1 KB joined string; ``msg_id`` and
    :meth:`id_at` re-encode them byte for byte (only for a resend's answer).  Text that is not
    such a list (another form of id, offsets 4 GiB apart) is kept as it is.

    Untracked by the cycle collector: a full window of single sends holds 500 000 of them, which
    every full collection walked (they hold no cycle the collector must break: a pending one's
    ``send`` points back at it only until the put's outcome clears it, and the window's own
    references are dropped by ``DuplicateWindow.clear``)."""

    cdef public double deadline
    cdef public object window
    cdef public object topic
    cdef public object send
    cdef public object handle
    cdef public bint live
    cdef uint32_t _stride  # packed, _deltas NULL: id k's offset is _first + k * _stride (here: in live's padding)
    cdef public Py_ssize_t nbytes
    cdef public long long queue_id
    cdef public long long step
    cdef public long long queue_offset
    cdef public long long end
    cdef object _text  # the ids as text, when not packed ("": no answer yet)
    cdef object _host  # packed: the ids' common prefix (shared between records)
    cdef uint64_t _first  # packed: the first id's offset
    cdef uint32_t* _deltas  # packed: ids 1.._nids-1's offsets minus _first (PyMem: tracemalloc sees it), or NULL
    cdef uint32_t _nids  # packed: how many ids (0: not packed)
    cdef uint32_t _nkeys  # the send's keys (messages)
    # The keys' hashes, in message order, are kept by the record's table (its key ring:
    # ``HashTable._keep``), not by the record (no array a send): entries _kpos.._kpos+_nkeys-1
    # of the key ring of the table whose serial is _tid (0: none yet).
    cdef uint32_t _kpos
    cdef uint32_t _tid

    def __cinit__(self, *args, **kwargs):
        self._text = ""
        self._deltas = NULL
        self._nids = 0
        self.live = True
        _untrack(self)  # a Python subclass (heap types are tracked at allocation)

    def __dealloc__(self):
        if self._deltas != NULL:
            PyMem_Free(self._deltas)
            self._deltas = NULL

    cdef int _set_ids(self, object ids) except -1:
        """Keep ``ids`` (a put's answer: one offset message id, or several joined by commas),
        packed when it re-encodes byte for byte, else as text.  Packed: the first offset and,
        when the ids are evenly spaced (a batch of records of one size: the common case), their
        spacing (``_stride``, no array); else each id's distance from the first (``_deltas``)."""
        global _last_host
        cdef Py_ssize_t n, width, count, k, j, at
        cdef const unsigned char* p
        cdef uint64_t value, low, first = 0, delta, stride = 0
        cdef uint32_t* deltas = NULL
        cdef int d
        if self._deltas != NULL:
            PyMem_Free(self._deltas)
            self._deltas = NULL
        self._nids = 0
        self._stride = 0
        self._host = None
        self._text = ids
        if type(ids) is not str or not PyUnicode_IS_ASCII(ids):
            return 0
        n = PyUnicode_GET_LENGTH(ids)
        p = <const unsigned char*>PyUnicode_1BYTE_DATA(ids)
        width = 0
        while width < n and p[width] != 44:  # ","
            width += 1
        if width < 16 or width > 128 or (n + 1) % (width + 1) != 0:
            return 0
        count = (n + 1) // (width + 1)
        if tidemq_hex8(p + width - 16, &value) < 0 or tidemq_hex8(p + width - 8, &low) < 0:
            return 0
        first = (value << 32) | low
        for k in range(1, count):
            at = k * (width + 1)
            if p[at - 1] != 44 or not tidemq_same(p, p + at, width - 8):
                # another prefix, or another high half of the offset: the whole offset read
                if p[at - 1] != 44 or not tidemq_same(p, p + at, width - 16):
                    PyMem_Free(deltas)
                    return 0
                d = tidemq_hex8(p + at + width - 16, &value)
                d |= tidemq_hex8(p + at + width - 8, &low)
                value = (value << 32) | low
            else:  # (the common case: the same host and offset's high 32 bits, checked above)
                d = tidemq_hex8(p + at + width - 8, &value)
                value |= first & <uint64_t>0xFFFFFFFF00000000
            if d < 0 or value < first or value - first > 0xFFFFFFFFu:
                PyMem_Free(deltas)
                return 0
            delta = value - first
            if deltas != NULL:
                deltas[k - 1] = <uint32_t>delta
            elif k == 1:
                stride = delta
            elif delta != <uint64_t>k * stride:  # not evenly spaced: each distance kept
                deltas = <uint32_t*>PyMem_Malloc((count - 1) * sizeof(uint32_t))
                if deltas == NULL:
                    raise MemoryError()
                for j in range(1, k):
                    deltas[j - 1] = <uint32_t>(<uint64_t>j * stride)
                deltas[k - 1] = <uint32_t>delta
        host = _last_host
        if (host is None or PyUnicode_GET_LENGTH(host) != width - 16
                or memcmp(PyUnicode_1BYTE_DATA(host), p, width - 16) != 0):
            host = ids[:width - 16]
            _last_host = host
        self._host = host
        self._first = first
        self._deltas = deltas
        self._stride = <uint32_t>stride if deltas == NULL else 0
        self._nids = count
        self._text = None
        return 0

    cdef inline uint64_t _offset(self, Py_ssize_t pos) noexcept:
        if self._deltas != NULL:
            return self._first + (self._deltas[pos - 1] if pos > 0 else 0)
        return self._first + <uint64_t>pos * self._stride

    cdef void _write_id(self, unsigned char* out, Py_ssize_t pos) noexcept:
        cdef Py_ssize_t hl = PyUnicode_GET_LENGTH(self._host)
        cdef uint64_t value = self._offset(pos)
        cdef int i
        memcpy(out, PyUnicode_1BYTE_DATA(self._host), hl)
        for i in range(15, -1, -1):
            out[hl + i] = _HEX[value & 15]
            value >>= 4

    @property
    def msg_id(self):
        """The answer's message id (a batch's: the ids joined by commas; "" before the answer)."""
        if self._nids == 0:
            return self._text
        cdef Py_ssize_t width = PyUnicode_GET_LENGTH(self._host) + 16
        cdef Py_ssize_t k
        text = PyUnicode_New(self._nids * (width + 1) - 1, 127)
        cdef unsigned char* out = PyUnicode_1BYTE_DATA(text)
        for k in range(self._nids):
            if k:
                out[k * (width + 1) - 1] = 44
            self._write_id(out + k * (width + 1), k)
        return text

    @msg_id.setter
    def msg_id(self, ids):
        self._set_ids(ids)

    @property
    def answered(self):
        """Whether the answer is kept (its message ids set)."""
        return self._nids > 0 or bool(self._text)

    @property
    def packed(self):
        """How many message ids are kept as numbers (0: as text)."""
        return self._nids

    @property
    def spacing(self):
        """Packed ids evenly spaced: the offsets' spacing (no array of distances); else -1."""
        return self._stride if self._nids > 0 and self._deltas == NULL else -1

    def id_at(self, Py_ssize_t pos):
        """Message ``pos``'s id (the whole ``msg_id`` when it has no id ``pos``)."""
        if self._nids == 0:
            ids = self._text.split(",")
            return ids[pos] if 0 <= pos < len(ids) else self._text
        if pos < 0 or pos >= self._nids:
            return self.msg_id
        text = PyUnicode_New(PyUnicode_GET_LENGTH(self._host) + 16, 127)
        self._write_id(PyUnicode_1BYTE_DATA(text), pos)
        return text

    @property
    def nkeys(self):
        """The send's keys (one a message)."""
        return self._nkeys

    def keep_hashes(self, object hashes not None):
        """The record's keys are ``hashes`` (an ``array("q")``, in message order): their number
        is kept here, the hashes themselves by the table that stores them
        (:meth:`HashTable.put_record`): a record holds no array."""
        self._nkeys = <uint32_t>len(hashes)

    @property
    def hashes(self):
        """The keys' hashes in message order (a new ``array("q")``), read from the key ring of
        the record's table while it keeps them: from the record's recording to its eviction (a
        send forgotten: until the key ring's tail passes it); else empty."""
        cdef HashTable table = _table_of(self)
        cdef Py_ssize_t j
        cdef Py_ssize_t n = self._nkeys if table is not None else 0
        cdef array.array out = array.clone(_Q, n, False)
        _untrack(out)
        for j in range(n):
            out.data.as_longlongs[j] = <long long>table._keys[(self._kpos + <uint32_t>j) & table._kmask]
        return out

    def index_of(self, int64_t h):
        """The position of key hash ``h`` among the send's keys (ValueError when not one of
        them); read from its table's key ring."""
        cdef HashTable table = _table_of(self)
        cdef uint32_t j
        cdef uint64_t u = <uint64_t>h
        if table is not None:
            for j in range(self._nkeys):
                if table._keys[(self._kpos + j) & table._kmask] == u:
                    return j
        raise ValueError(f"{h} is not a key of this send")

    def stored(self, send, result):
        """The first send's outcome is known (``send``'s fields are set): keep its answer, or
        forget the keys (``window.forget``) when it was not stored.  Called by the put's
        outcome, on the loop, once per send (the compiled send lane calls :data:`STORED_C`
        instead: the same, without a Python call)."""
        if self.send is None:
            return
        status = send.status
        if result is None or status not in STORED_CODES:
            self.send = None
            self.window.forget(self)
            return
        self._settle(send, result, status, send.msg_id, send.queue_offset)

    cdef int _settle(self, object send, object result, object status, object msg_id,
                     object queue_offset) except -1:
        """:meth:`stored` of a put that answered (``result``), with the send's status, message
        id and queue offset as its outcome set them."""
        if self.send is None:
            return 0
        self.send = None
        if status not in STORED_CODES:
            self.window.forget(self)
            return 0
        self._set_ids(msg_id)
        self.handle = send.recall_handle
        self.queue_id = send.queue_id
        self.queue_offset = queue_offset
        flag = send.msgs[0].sys_flag & _TX_MASK
        self.step = 0 if flag == _TX_PREPARED or flag == _TX_ROLLBACK else 1
        self.end = result.wrote_offset + result.wrote_bytes
        return 0


cdef int _stored_c(object sent, object send, object result, object status, object msg_id,
                   object queue_offset) except -1:
    """``sent.stored(send, result)`` for a caller in C that has just set ``send``'s ``status``,
    ``msg_id`` and ``queue_offset`` to these and whose ``result`` is not None: 1 when done, 0
    when ``sent`` is not a compiled record (the caller then calls ``stored`` itself)."""
    if (_PyType_Lookup(Py_TYPE(sent), "stored") != <PyObject*>_STORED_DESCR
            or not isinstance(sent, SentFields)):
        return 0  # not a record, or one whose type overrides ``stored``: the caller calls it
    (<SentFields>sent)._settle(send, result, status, msg_id, queue_offset)
    return 1


cdef object _STORED_DESCR = SentFields.__dict__["stored"]

#: ``_stored_c``'s address for the compiled send lane (``_send_lane.pyx``'s settle): the put's
#: outcome tells the window without a Python call.  Its C type:
#: ``int (*)(object sent, object send, object result, object status, object msg_id,
#: object queue_offset) except -1``.
STORED_C = PyCapsule_New(<void*>_stored_c, b"tidemq.broker._dedup_table.STORED_C", NULL)


cdef enum:
    _WAYS = 8  # slots a bucket: 8 x 8 bytes, one 64-byte cache line
    _PROBE = 16  # buckets a key may go to (its home and the next ones, each passed flagged)
    _SWEEP = 1 << 30  # ring pushes between sweeps of the dead slots (positions are 32-bit)
    # The table doubles past 1/_LOAD of its slots live.  A group's segments share a home bucket:
    # single sends counting up put up to 8 slots (one a send) in one bucket, whole buckets
    # then cluster as linear probing does at load 1/2 (1.5 million single sends through a
    # window of 500 000: 1 648 keys displaced, 56 % of buckets flagged); at 1/4, see the docs.
    _LOAD = 4


cdef uint32_t _table_serial = 0  # the last HashTable's serial (_id)
cdef uint32_t _OVER = 0x80000000u  # a bucket's first slot's top bit: keys of it went further
cdef uint32_t _FP = 0x7FFFFFFFu


cdef class HashTable:
    """64-bit key hash -> object (the :class:`~tidemq.broker.dedup.Sent` that stored the key).

    Two arrays (issue 37, the full window's memory):

    * the **ring**: one 16-byte entry per key (its full hash and the object), appended in arrival
      order and consumed from the tail as the oldest keys leave (a key that leaves out of order
      leaves a hole, passed over when the tail reaches it); written and read sequentially at its
      two ends;
    * the **slots**, read at random: 8 bytes each, the hash's high 32 bits (its fingerprint,
      which also gives its home bucket) and the key's position in the ring (absolute, 32-bit,
      monotonic).  Slots come in **buckets** of 8, one 64-byte cache line: a key is looked for in
      its home bucket (one cache line, prefetched a run ahead), and in the next only while the
      bucket read is full of live keys (at most ``_PROBE`` buckets).

    **Lazy deletion** (session 8b): a slot is live only while its ring position is between the
    ring's tail and head, so the window's eviction, which removes the oldest send's keys, only
    advances the ring's tail (sequential memory, :meth:`_evict`): no slot is read or written.  An
    insert takes an empty or dead slot of the bucket; a key that leaves out of order (a send not
    stored, a declined run) has its slot emptied at once.  Dead slots are swept every 2^30 pushes
    (so a 32-bit position is never mistaken after it wraps) and when the slots are rebuilt.

    When ``_PROBE`` buckets in a row are full of live keys (about never at the table's load of at
    most 1/2), the insert **displaces** the oldest live key of its home bucket: that key loses
    its protection early, as if evicted (counted in :attr:`displaced`; :meth:`put` returns its
    object as replaced).  A ring that fills is compacted in place when at most 3/4 of it is live,
    else doubled; a table over half full doubles its buckets (slots rebuilt from the ring, in
    arrival order)."""

    cdef Slot* _slots  # 64-byte aligned
    cdef Py_ssize_t _mask  # slots - 1
    cdef Py_ssize_t _bmask  # buckets - 1
    cdef Py_ssize_t _used  # live keys
    cdef Py_ssize_t _displaced
    cdef void* _map  # the mapping of a huge-page slot array (NULL: _raw, from PyMem_Calloc)
    cdef size_t _map_len
    cdef void* _raw
    cdef Entry* _ring
    cdef uint32_t _rmask
    cdef uint32_t _head  # the next entry's (absolute) position
    cdef uint32_t _tail  # the oldest entry's (absolute) position
    cdef uint32_t _swept  # the head at the last sweep of dead slots
    cdef uint32_t* _masks  # per ring entry: a segment's keys (bit i: its group's key i); 0: one key
    cdef Py_ssize_t _nslots  # live slots (ring entries not holes): the table's load
    cdef Py_ssize_t _dropped  # keys the last displacement removed
    # The key ring (session 11): the hashes of each recorded send's keys, in message order, one
    # send after another in arrival order (``put_record``, the compiled run); a record reads its
    # own there (``_kpos``, ``_nkeys``) for ``position``, a removal out of order (``forget``, an
    # eviction whose keys are not all at the ring's tail) and ``hashes``.  Absolute 32-bit
    # positions; the tail advances as records are evicted (oldest first), so it holds the
    # window's keys plus those of sends forgotten or taken over since the oldest.  Allocated at
    # the first record, doubled when full (positions kept): no allocation a send.
    cdef uint64_t* _keys
    cdef uint32_t _kmask  # capacity - 1 (capacity 0: _keys NULL)
    cdef uint32_t _khead
    cdef uint32_t _ktail
    cdef uint32_t _id  # this table's serial (a record's _tid), never 0

    def __cinit__(self, Py_ssize_t capacity=64):
        cdef Py_ssize_t cap = 16
        cdef Py_ssize_t rcap = 16
        while cap < capacity * 2:
            cap <<= 1
        while rcap < capacity:
            rcap <<= 1
        self._slots = NULL
        self._map = NULL
        self._map_len = 0
        self._raw = NULL
        self._ring = NULL
        self._masks = NULL
        self._used = 0
        self._nslots = 0
        self._dropped = 0
        self._displaced = 0
        self._keys = NULL
        self._kmask = 0
        self._khead = 0
        self._ktail = 0
        global _table_serial
        _table_serial += 1
        if _table_serial == 0:
            _table_serial = 1
        self._id = _table_serial
        self._alloc(cap)
        self._ring = <Entry*>PyMem_Malloc(rcap * sizeof(Entry))
        self._masks = <uint32_t*>PyMem_Malloc(rcap * sizeof(uint32_t))
        if self._ring == NULL or self._masks == NULL:
            raise MemoryError()
        self._rmask = <uint32_t>(rcap - 1)
        self._head = 0
        self._tail = 0
        self._swept = 0

    cdef int _alloc(self, Py_ssize_t cap) except -1:
        """A zeroed, 64-byte aligned array of ``cap`` slots as ``_slots`` (the old one left to
        the caller)."""
        cdef void* base = NULL
        cdef size_t length = 0
        cdef void* raw = NULL
        cdef Slot* slots = <Slot*>tidemq_huge_alloc(cap * sizeof(Slot), &base, &length)
        if slots == NULL:
            raw = PyMem_Calloc(cap * sizeof(Slot) + 64, 1)
            if raw == NULL:
                raise MemoryError()
            slots = <Slot*>((<size_t>raw + 63) & ~(<size_t>63))
        self._slots = slots
        self._map = base
        self._map_len = length
        self._raw = raw
        self._mask = cap - 1
        self._bmask = cap // _WAYS - 1
        return 0

    cdef void _free(self, void* raw, void* base, size_t length) noexcept:
        if length:
            tidemq_huge_free(base, length)
        else:
            PyMem_Free(raw)

    def __dealloc__(self):
        cdef uint32_t k
        if self._ring != NULL:
            k = self._tail
            while k != self._head:
                Py_XDECREF(self._ring[k & self._rmask].value)
                k += 1
            PyMem_Free(self._ring)
            self._ring = NULL
        if self._masks != NULL:
            PyMem_Free(self._masks)
            self._masks = NULL
        if self._keys != NULL:
            PyMem_Free(self._keys)
            self._keys = NULL
        if self._slots != NULL:
            self._free(self._raw, self._map, self._map_len)
            self._slots = NULL

    def __len__(self):
        return self._used

    @property
    def capacity(self):
        """Slots (8 bytes each, in buckets of 8)."""
        return self._mask + 1

    @property
    def ring_capacity(self):
        """Ring entries (16 bytes each)."""
        return self._rmask + 1

    @property
    def ring_span(self):
        """Ring entries from the oldest kept to the newest, holes included."""
        return <uint32_t>(self._head - self._tail)

    @property
    def flagged(self):
        """Buckets flagged (a key of theirs went to the next when they were full): a check in
        one reads two cache lines or more (a scan of the table: for tests and benchmarks)."""
        cdef Py_ssize_t b, n = 0
        for b in range(self._bmask + 1):
            n += self._over(b)
        return n

    @property
    def slots_used(self):
        """Live slots: one a key, or one a segment (up to 8 keys of a group and one send)."""
        return self._nslots

    @property
    def displaced(self):
        """Keys displaced so far (their buckets full): each lost its protection early."""
        return self._displaced

    cdef inline bint _live(self, Slot s) noexcept:
        return (s.fp & _FP) != 0 and <uint32_t>(s.idx - self._tail) < <uint32_t>(self._head - self._tail)

    cdef inline void _prefetch(self, uint64_t h) noexcept:
        __builtin_prefetch(&self._slots[<Py_ssize_t>(_fp(h) & <uint32_t>self._bmask) * _WAYS])

    cdef inline bint _over(self, Py_ssize_t b) noexcept:
        return (self._slots[b * _WAYS].fp & _OVER) != 0

    cdef inline void _set(self, Py_ssize_t at, uint32_t f, uint32_t k) noexcept:
        self._slots[at].fp = f | (self._slots[at].fp & _OVER)
        self._slots[at].idx = k

    cdef inline void _clear(self, Py_ssize_t at) noexcept:
        self._slots[at].fp &= _OVER
        self._slots[at].idx = 0

    cdef inline Py_ssize_t _keys_at(self, uint32_t k) noexcept:
        """The keys of ring entry ``k`` (a segment's, else 1)."""
        cdef uint32_t m = self._masks[k & self._rmask]
        return tidemq_popcount(m) if m else 1

    cdef Py_ssize_t _probe(self, uint64_t h, Py_ssize_t* free, PyObject* own, Py_ssize_t* seg,
                           uint32_t* present=NULL) noexcept:
        """The slot holding ``h``, or -1; ``free[0]``: the first free (empty or dead) slot met
        (-1: none); ``seg[0]`` (when ``own``): the slot of ``own``'s segment of ``h``'s group,
        or -1; ``present[0]`` (when given and ``h`` is absent): the keys of ``h``'s group held
        (the union of its live segments' masks).  A run hash (bit 63) is held as its bit of a segment (its group's hash, the
        ring entry's mask); any other as its own entry.  Reads the home bucket, and the next while the one read is flagged (a key of
        it or before it went further when it was full), at most ``_PROBE``.  A flag found stale
        (the next bucket holds no key from before it and is not flagged itself) is cleared."""
        cdef uint32_t f = _fp(h)
        cdef Py_ssize_t b = <Py_ssize_t>(f & <uint32_t>self._bmask)
        cdef Py_ssize_t p, i, at
        cdef Slot* bucket
        cdef Entry* e
        cdef bint visitors
        cdef uint64_t key = h
        cdef uint32_t bit = 0
        if h & TIDEMQ_RUN_BIT:
            key = h & ~TIDEMQ_GROUP_LOW
            bit = 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
        free[0] = -1
        if seg != NULL:
            seg[0] = -1
        if present != NULL:
            present[0] = 0
        for p in range(_PROBE):
            bucket = &self._slots[b * _WAYS]
            visitors = False
            for i in range(_WAYS):
                if self._live(bucket[i]):
                    if (bucket[i].fp & _FP) == f:
                        e = &self._ring[bucket[i].idx & self._rmask]
                        if e.hash == key and e.value != NULL:
                            if bit == 0 or (self._masks[bucket[i].idx & self._rmask] & bit):
                                return b * _WAYS + i
                            if present != NULL:
                                present[0] |= self._masks[bucket[i].idx & self._rmask]
                            if e.value == own and own != NULL:
                                seg[0] = b * _WAYS + i
                    if p and <Py_ssize_t>(bucket[i].fp & <uint32_t>self._bmask) != b:
                        visitors = True
                elif free[0] < 0:
                    free[0] = b * _WAYS + i
            at = b
            b = (b + 1) & self._bmask
            if p and not visitors and not (bucket[0].fp & _OVER):
                # nothing came here from before and nothing went on: the previous flag is stale
                self._slots[((at - 1) & self._bmask) * _WAYS].fp &= _FP
            if not (bucket[0].fp & _OVER):
                return -1
        return -1

    cdef Py_ssize_t _find(self, uint64_t h) noexcept:
        """The slot holding ``h``, or -1."""
        cdef Py_ssize_t free
        return self._probe(h, &free, NULL, NULL)

    cdef Py_ssize_t _slot_for(self, uint64_t h, PyObject* own, Py_ssize_t* displaced, Py_ssize_t* seg,
                              uint32_t* present=NULL) noexcept:
        """The slot holding ``h`` (>= 0), or ``-1 - slot`` of the free (empty or dead) slot it
        goes to: one cache line read for a check and its record (two when its bucket is
        flagged).  ``seg[0]``: ``own``'s segment of ``h``'s group (a run hash), which the key
        joins without a slot (then -1 is returned).  When ``_PROBE`` buckets in a row are full
        of live keys, the oldest of the home bucket is displaced to free one (``displaced[0]``
        and :attr:`displaced` counted, in keys)."""
        cdef Py_ssize_t free, b
        cdef Py_ssize_t at = self._probe(h, &free, own, seg, present)
        if at >= 0:
            return at
        if seg[0] >= 0:
            return -1
        if free >= 0:
            # a free slot past the home bucket: the full ones before it flagged (again: the walk
            # may have found a flag stale, and this key now comes after it)
            b = <Py_ssize_t>(_fp(h) & <uint32_t>self._bmask)
            while b != free // _WAYS:
                self._slots[b * _WAYS].fp |= _OVER
                b = (b + 1) & self._bmask
        else:
            free = self._free_slot(_fp(h))
            if free < 0:
                free = -1 - free
                displaced[0] += self._dropped
        return -1 - free

    cdef Py_ssize_t _free_slot(self, uint32_t f) noexcept:
        """A free slot for fingerprint ``f`` (its home bucket full): the first of the next
        buckets, each full one passed flagged; else (``_PROBE`` full) the home bucket's oldest
        key displaced, its slot returned as ``-1 - slot``."""
        cdef Py_ssize_t home = <Py_ssize_t>(f & <uint32_t>self._bmask)
        cdef Py_ssize_t b = home
        cdef Py_ssize_t p, i, at
        cdef Slot* bucket
        cdef uint32_t age, oldest
        for p in range(_PROBE):
            bucket = &self._slots[b * _WAYS]
            for i in range(_WAYS):
                if not self._live(bucket[i]):
                    return b * _WAYS + i
            if p + 1 < _PROBE:
                bucket[0].fp |= _OVER
            b = (b + 1) & self._bmask
        bucket = &self._slots[home * _WAYS]
        oldest = 0xFFFFFFFFu
        at = home * _WAYS
        for i in range(_WAYS):
            age = bucket[i].idx - self._tail
            if age < oldest:
                oldest = age
                at = home * _WAYS + i
        self._dropped = self._drop_slot(at)
        self._displaced += self._dropped
        return -1 - at

    cdef inline Py_ssize_t _drop_slot(self, Py_ssize_t at) noexcept:
        """Empty live slot ``at``: its entry a hole, its object released; its keys' number."""
        cdef uint32_t k = self._slots[at].idx
        cdef Entry* e = &self._ring[k & self._rmask]
        cdef PyObject* old = e.value
        cdef Py_ssize_t n = self._keys_at(k)
        self._masks[k & self._rmask] = 0
        e.value = NULL
        self._clear(at)
        self._used -= n
        self._nslots -= 1
        self._pass_holes()
        Py_XDECREF(old)
        return n

    cdef inline PyObject* _value_at(self, Py_ssize_t at) noexcept:
        return self._ring[self._slots[at].idx & self._rmask].value

    cdef void _place(self, uint32_t f, uint32_t k) noexcept:
        """Put (``f``, ``k``) in a free slot of its buckets (slots being rebuilt, in ring order)."""
        cdef Py_ssize_t at = self._free_slot(f)
        if at < 0:
            at = -1 - at  # (about never: a key displaced, counted out by _drop_slot)
        self._set(at, f, k)

    cdef void _rebuild(self) noexcept:
        """The slots made again from the ring's live entries (dead slots swept)."""
        cdef uint32_t k = self._tail
        cdef Entry* e
        memset(self._slots, 0, (self._mask + 1) * sizeof(Slot))
        while k != self._head:
            e = &self._ring[k & self._rmask]
            if e.value != NULL:
                self._place(_fp(e.hash), k)
            k += 1
        self._swept = self._head

    cdef int _grow(self) except -1:
        cdef Slot* old = self._slots
        cdef void* old_map = self._map
        cdef size_t old_len = self._map_len
        cdef void* old_raw = self._raw
        self._alloc((self._mask + 1) * 2)  # raises before anything moved: the old array stays whole
        self._free(old_raw, old_map, old_len)
        self._rebuild()
        return 0

    cdef void _sweep(self) noexcept:
        """Empty the dead slots (every 2^30 pushes: a position is then never 2^32 old)."""
        cdef Py_ssize_t i
        for i in range(self._mask + 1):
            if (self._slots[i].fp & _FP) != 0 and not self._live(self._slots[i]):
                self._clear(i)
        self._swept = self._head

    cdef int _reserve(self) except -1:
        """Room for one more ring entry: the ring compacted (at most 3/4 live) or doubled."""
        cdef uint32_t span = self._head - self._tail
        cdef uint32_t rcap = self._rmask + 1
        cdef uint32_t newcap, k, j, newmask
        cdef Entry* fresh
        cdef Entry e
        if <uint32_t>(self._head - self._swept) >= <uint32_t>_SWEEP:
            self._sweep()
        if span <= self._rmask:
            return 0
        cdef uint32_t* masks
        cdef bint compact = <Py_ssize_t>self._nslots * 4 <= <Py_ssize_t>rcap * 3
        newcap = rcap if compact else rcap * 2
        if newcap == 0 or newcap > (1u << 31):
            raise MemoryError("the duplicate window's key ring is full")
        fresh = <Entry*>PyMem_Malloc(newcap * sizeof(Entry))
        masks = <uint32_t*>PyMem_Malloc(newcap * sizeof(uint32_t))
        if fresh == NULL or masks == NULL:
            PyMem_Free(fresh)
            PyMem_Free(masks)
            raise MemoryError()
        newmask = newcap - 1
        k = self._tail
        if compact:  # the live entries moved to 0.., the slots rebuilt for their new positions
            j = 0
            while k != self._head:
                e = self._ring[k & self._rmask]
                if e.value != NULL:
                    fresh[j] = e
                    masks[j] = self._masks[k & self._rmask]
                    j += 1
                k += 1
            PyMem_Free(self._ring)
            PyMem_Free(self._masks)
            self._ring = fresh
            self._masks = masks
            self._rmask = newmask
            self._tail = 0
            self._head = j
            self._rebuild()
            return 0
        while k != self._head:  # the same absolute positions: the slots stay
            fresh[k & newmask] = self._ring[k & self._rmask]
            masks[k & newmask] = self._masks[k & self._rmask]
            k += 1
        PyMem_Free(self._ring)
        PyMem_Free(self._masks)
        self._ring = fresh
        self._masks = masks
        self._rmask = newmask
        return 0

    cdef inline uint32_t _push(self, uint64_t h, object value) noexcept:
        """Append (``h``, ``value``) to the ring (room reserved); its position.  A run hash
        (bit 63): a segment of its group holding it (its mask set)."""
        cdef uint32_t k = self._head
        cdef Entry* e = &self._ring[k & self._rmask]
        if h & TIDEMQ_RUN_BIT:
            self._masks[k & self._rmask] = 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
            h &= ~TIDEMQ_GROUP_LOW
        else:
            self._masks[k & self._rmask] = 0
        Py_INCREF(value)
        e.hash = h
        e.value = <PyObject*>value
        self._head = k + 1
        return k

    cdef inline void _pass_holes(self) noexcept:
        while self._tail != self._head and self._ring[self._tail & self._rmask].value == NULL:
            self._tail += 1

    cdef int _insert(self, Py_ssize_t at, uint64_t h, object value) except -1:
        """Store ``value`` under ``h`` at free slot ``at`` (``_slot_for``'s; ``_reserve`` done)."""
        self._set(at, _fp(h), self._push(h, value))
        self._used += 1
        self._nslots += 1
        return 0

    cdef int _store(self, Py_ssize_t r, uint64_t h, object value, Py_ssize_t seg) except -1:
        """Store absent ``h`` for ``value`` where ``_slot_for`` said (``r``, ``seg``): its bit
        set in ``value``'s segment, or a new entry at free slot ``-1 - r``."""
        if seg >= 0:
            self._masks[self._slots[seg].idx & self._rmask] |= 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
            self._used += 1
            return 0
        return self._insert(-1 - r, h, value)

    cdef inline void _unset(self, Py_ssize_t at, uint64_t h) noexcept:
        """Run hash ``h`` leaves its segment at slot ``at`` (the segment with it, when last)."""
        cdef uint32_t k = self._slots[at].idx & self._rmask
        cdef uint32_t bit = 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
        if self._masks[k] == bit:
            self._drop_slot(at)
        else:
            self._masks[k] &= ~bit
            self._used -= 1

    cdef int _retake(self, Py_ssize_t at, uint64_t h, object value, Py_ssize_t* displaced) except -1:
        """Slot ``at`` (holding ``h``) now stores ``value``: its old entry a hole, a new one
        appended (the ring stays in arrival order; ``_reserve`` done).  A run hash leaves its
        old segment and joins ``value``'s."""
        cdef Py_ssize_t seg, r
        if h & TIDEMQ_RUN_BIT:
            self._unset(at, h)
            r = self._slot_for(h, <PyObject*>value, displaced, &seg)
            return self._store(r, h, value, seg)
        cdef uint32_t k = self._slots[at].idx
        cdef PyObject* old = self._ring[k & self._rmask].value
        self._ring[k & self._rmask].value = NULL
        self._slots[at].idx = self._push(h, value)
        self._pass_holes()
        Py_XDECREF(old)
        return 0

    cdef object _put(self, uint64_t h, object value):
        """Store ``value`` under ``h``; the object it replaced (or displaced), or None."""
        cdef Py_ssize_t at, seg
        cdef Py_ssize_t displaced = 0
        cdef PyObject* gone
        if (self._nslots + 1) * _LOAD > self._mask + 1:
            self._grow()
        self._reserve()
        at = self._slot_for(h, <PyObject*>value, &displaced, &seg)
        if at < 0:
            result = None
            if displaced:  # the displaced key's object, for the caller's count (a reference kept)
                result = True
            self._store(at, h, value, seg)
            return result
        result = <object>self._value_at(at)  # a reference for the caller
        if (h & TIDEMQ_RUN_BIT) and result is value:
            return result  # already in value's segment
        self._retake(at, h, value, &displaced)
        return result

    cdef void _remove_key(self, Py_ssize_t at, uint64_t h) noexcept:
        """Remove key ``h`` at live slot ``at`` now (out of order: its slot emptied, or its bit
        of a segment cleared)."""
        if h & TIDEMQ_RUN_BIT:
            self._unset(at, h)
        else:
            self._drop_slot(at)

    cdef inline bint _holds(self, SentFields sent) noexcept:
        """Whether ``sent``'s keys' hashes are in this table's key ring (it was recorded here and
        not evicted since)."""
        cdef uint32_t span = self._khead - self._ktail
        cdef uint32_t off = sent._kpos - self._ktail
        return sent._tid == self._id and off <= span and sent._nkeys <= span - off

    cdef int _keep(self, SentFields sent, const uint64_t* data, Py_ssize_t n) except -1:
        """``sent``'s keys' hashes (``n``, in message order) appended to the key ring: its own."""
        cdef uint32_t span = self._khead - self._ktail
        cdef uint64_t cap = (<uint64_t>self._kmask + 1) if self._keys != NULL else 0
        cdef uint64_t newcap
        cdef uint32_t k, newmask
        cdef uint64_t* fresh
        cdef Py_ssize_t j
        if <uint64_t>span + <uint64_t>n > cap:
            newcap = cap if cap else 64
            while newcap < <uint64_t>span + <uint64_t>n:
                newcap *= 2
            if newcap > (1u << 31):
                raise MemoryError("the duplicate window's key ring is full")
            fresh = <uint64_t*>PyMem_Malloc(newcap * sizeof(uint64_t))
            if fresh == NULL:
                raise MemoryError()
            newmask = <uint32_t>(newcap - 1)
            k = self._ktail
            while k != self._khead:  # the same absolute positions: the records' stay
                fresh[k & newmask] = self._keys[k & self._kmask]
                k += 1
            PyMem_Free(self._keys)
            self._keys = fresh
            self._kmask = newmask
        k = self._khead
        for j in range(n):
            self._keys[(k + <uint32_t>j) & self._kmask] = data[j]
        sent._kpos = k
        sent._nkeys = <uint32_t>n
        sent._tid = self._id
        self._khead = k + <uint32_t>n
        return 0

    cdef Py_ssize_t _remove_kept(self, SentFields sent) noexcept:
        """Remove the keys still ``sent``'s, found by its hashes in the key ring (out of order:
        each probed); how many were (0 when the ring does not hold its hashes)."""
        cdef uint32_t j, n
        cdef Py_ssize_t at, removed = 0
        cdef uint64_t h
        if not self._holds(sent):
            return 0
        n = sent._nkeys
        for j in range(n):
            self._prefetch(_slot_hash(<int64_t>self._keys[(sent._kpos + j) & self._kmask]))
        for j in range(n):
            h = _slot_hash(<int64_t>self._keys[(sent._kpos + j) & self._kmask])
            at = self._find(h)
            if at >= 0 and self._value_at(at) == <PyObject*>sent:
                self._remove_key(at, h)
                removed += 1
        return removed

    cdef Py_ssize_t _evict(self, SentFields sent) except -1:
        """Remove the keys still ``sent``'s, ``sent`` being the oldest send of the table: its
        entries are the ring's tail, so the tail advances past them (sequential memory; their
        slots die by position).  Keys of it out of place (a ring not in order) are probed for,
        by its hashes in the key ring, whose tail then passes them.  How many were removed."""
        cdef Py_ssize_t removed = 0
        cdef Entry* e
        cdef PyObject* me = <PyObject*>sent
        cdef uint32_t end
        self._pass_holes()
        while self._tail != self._head:
            e = &self._ring[self._tail & self._rmask]
            if e.value != me:
                break
            e.value = NULL
            removed += self._keys_at(self._tail)
            self._tail += 1
            self._nslots -= 1
            Py_XDECREF(me)  # the table's reference (the caller holds one)
            self._pass_holes()
        self._used -= removed
        if self._holds(sent):
            if removed < <Py_ssize_t>sent._nkeys:
                removed += self._remove_kept(sent)
            end = sent._kpos + sent._nkeys
            self._ktail = end  # (records leave oldest first: the ones before are gone)
        return removed

    def evict(self, SentFields sent not None):
        """See :meth:`_evict` (the window's trim calls it on its oldest send)."""
        return self._evict(sent)

    def put_record(self, array.array hashes not None, SentFields sent not None):
        """:meth:`put_many` of ``sent`` under ``hashes`` (its keys', in message order), which
        this table then keeps for it (:meth:`remove_record`, :meth:`evict`, ``sent.hashes``,
        ``sent.index_of``)."""
        cdef Py_ssize_t n = _check_q(hashes)
        replaced = self.put_many(hashes, sent)
        self._keep(sent, <const uint64_t*>hashes.data.as_longlongs, n)
        return replaced

    def remove_record(self, SentFields sent not None):
        """Remove the keys still ``sent``'s (a send not stored, removed early: the window's
        ``forget``), by the hashes this table keeps for it; how many were."""
        return self._remove_kept(sent)

    def get(self, int64_t h):
        """The object under ``h``, or None."""
        cdef Py_ssize_t i = self._find(_slot_hash(h))
        if i < 0:
            return None
        return <object>self._value_at(i)

    def put(self, int64_t h, object value):
        """Store ``value`` under ``h``; the object it replaced, or None (True when it displaced
        another key: that key's count leaves too)."""
        return self._put(_slot_hash(h), value)

    def put_many(self, array.array hashes not None, object value):
        """Store ``value`` under every hash (an ``array("q")``); the replaced objects (None when
        none was; True for a key displaced)."""
        cdef Py_ssize_t n = _check_q(hashes)
        cdef long long* data = hashes.data.as_longlongs
        cdef Py_ssize_t i
        replaced = None
        for i in range(n):
            self._prefetch(_slot_hash(data[i]))
        for i in range(n):
            old = self._put(_slot_hash(data[i]), value)
            if old is not None:
                if replaced is None:
                    replaced = []
                replaced.append(old)
        return replaced

    def any_of(self, array.array hashes not None):
        """Whether any of the hashes (an ``array("q")``) is in the table."""
        cdef Py_ssize_t n = _check_q(hashes)
        cdef long long* data = hashes.data.as_longlongs
        cdef Py_ssize_t i
        for i in range(n):
            self._prefetch(_slot_hash(data[i]))
        for i in range(n):
            if self._find(_slot_hash(data[i])) >= 0:
                return True
        return False

    def remove_many(self, array.array hashes not None, object value):
        """Remove the hashes (an ``array("q")``) still stored with ``value`` (identity); how many
        were."""
        return self._remove_many(hashes, value)

    cdef Py_ssize_t _remove_many(self, array.array hashes, object value) except -1:
        cdef Py_ssize_t n = _check_q(hashes)
        cdef long long* data = hashes.data.as_longlongs
        cdef Py_ssize_t i, at
        cdef Py_ssize_t removed = 0
        for i in range(n):
            self._prefetch(_slot_hash(data[i]))
        for i in range(n):
            at = self._find(_slot_hash(data[i]))
            if at >= 0 and self._value_at(at) == <PyObject*>value:
                self._remove_key(at, _slot_hash(data[i]))
                removed += 1
        return removed


cdef HashTable _table_of(SentFields sent):
    """The table keeping ``sent``'s hashes (its window's table of its topic), or None."""
    window = sent.window
    if isinstance(window, WindowFields):
        found = (<WindowFields>window)._topics.get(sent.topic)
    else:
        topics = getattr(window, "_topics", None)
        found = topics.get(sent.topic) if isinstance(topics, dict) else None
    if isinstance(found, HashTable) and (<HashTable>found)._holds(sent):
        return <HashTable>found
    return None


cdef object _props_type = None  # the message type whose ``properties`` slot offset is cached
cdef Py_ssize_t _props_offset = -1


cdef Py_ssize_t _properties_offset(object msg_type) except -2:
    """The offset of ``msg_type``'s ``properties`` slot (-1: read it as an attribute)."""
    global _props_type, _props_offset
    if msg_type is _props_type:
        return _props_offset
    descr = None
    for klass in (<type>msg_type).__mro__:
        descr = (<type>klass).__dict__.get("properties")
        if descr is not None:
            break
    _props_offset = tidemq_slot_offset(<PyObject*>descr) if descr is not None else -1
    _props_type = msg_type
    return _props_offset


cdef inline object _key_of(object msg, str name, Py_ssize_t max_length):
    """Message ``msg``'s key (property ``name``) when usable (a str of 1..max_length), else None.
    A message type with a ``properties`` slot (attrs' ``MessageInner``) has it read in place,
    without the attribute lookup; any other through ``getattr``."""
    cdef Py_ssize_t offset = _properties_offset(type(msg))
    cdef PyObject* slot
    if offset >= 0:
        slot = tidemq_slot_at(msg, offset)
        if slot == NULL:
            props = msg.properties  # unset: the AttributeError the attribute read raises
        else:
            props = <object>slot
    else:
        props = msg.properties
    if type(props) is not dict:
        return None
    cdef PyObject* found = PyDict_GetItem(props, name)
    if found == NULL:
        return None
    key = <object>found
    if type(key) is not str:
        return None
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(key)
    if n == 0 or n > max_length:
        return None
    return key


def batch_keys(list msgs not None, str name not None, Py_ssize_t max_length):
    """The batch's keys (property ``name`` of each message) and their hashes, as
    ``(keys, hashes, repeated)``: ``repeated`` is -1, or the index of the first message whose key
    an earlier one has.  None when a message has no usable key (absent, empty, longer than
    ``max_length``, not a str).  One C pass for what the send path did in four."""
    cdef Py_ssize_t n = len(msgs)
    cdef Py_ssize_t i
    cdef Py_ssize_t repeated = -1
    cdef list keys = [None] * n
    cdef array.array hashes = array.clone(_Q, n, False)
    cdef long long* out = hashes.data.as_longlongs
    cdef set seen = set() if n > 1 else None
    for i in range(n):
        key = _key_of(msgs[i], name, max_length)
        if key is None:
            return None
        keys[i] = key
        out[i] = _hash_key(key)
        if seen is not None and repeated < 0:
            PySet_Add(seen, key)
            if PySet_GET_SIZE(seen) != i + 1:
                repeated = i
    return keys, hashes, repeated


cdef struct RunCounts:
    Py_ssize_t keys  # keys recorded
    Py_ssize_t recorded  # sends recorded
    Py_ssize_t replaced  # expired keys they took over
    Py_ssize_t displaced  # keys displaced from full buckets (each lost its protection early)


def admit_run(
    list sends not None,
    object topic_settings,
    object config_of,
    dict tables not None,
    object order,
    object sent_type,
    object window,
    double now,
    Py_ssize_t max_entries,
    Py_ssize_t per_key,
    Py_ssize_t per_send,
    str name not None,
    Py_ssize_t max_length,
    dict settings_cache=None,
):
    """The duplicate window over one run of prepared sends, in one call (issue 37): what
    ``DuplicateWindow.admit_run_py`` does, in C loops, without the window's counters and trim
    (:meth:`WindowFields.admit_run` does those too, in the same call).

    Each send's keys (property ``name`` of its messages; ``send.msgs[0].topic`` its topic,
    ``topic_settings(topic, config_of(topic))`` its ``(seconds, keyed on content)``) are read and
    hashed.  A send whose messages all have a usable key is recorded pending: a ``sent_type`` (a
    subclass of :class:`SentFields`, made without ``__init__``: window, topic, its keys'
    number, ``now + seconds``, the send) under each key's hash in ``tables[topic]`` (created
    when missing), which keeps the hashes for it (``HashTable._keep``), its ``nbytes`` set, appended to ``order`` and set as ``send.dedup``.  Returns ``(keys, sends,
    replaced, 0)``: the keys recorded, the sends recorded, the expired keys they took over (the
    last: the reference's sends not kept).

    A key the table holds with a deadline after ``now`` (a resend, or a key met earlier in the
    run: its deadline is later than ``now`` too) declines the run: what this call recorded is
    undone (the keys it took over restored) and it returns None.  A topic keyed on content, or a
    send of more than ``max_entries`` keys: False, nothing recorded (the reference serves it).

    ``settings_cache``: ``topic_settings``' own cache (topic -> ``(config, seconds, content)``),
    read here first: a hit on the same config object is what ``topic_settings`` would return,
    without its Python call; a miss calls it.
    """
    cdef RunCounts counts
    cdef int verdict = _admit(
        sends, topic_settings, None, config_of, tables, order, sent_type, window, now, max_entries,
        per_key, per_send, name, max_length, settings_cache, &counts
    )
    if verdict == 0:
        return None
    if verdict == 1:
        return False
    return counts.keys, counts.recorded, counts.replaced + counts.displaced, 0


cdef struct KeyBuf:
    uint64_t* p  # a run's keys' hashes, the sends' one after another
    Py_ssize_t cap
    bint shared  # p is the module's buffer (_kbuf), reused from run to run


cdef uint64_t* _kbuf = NULL
cdef Py_ssize_t _kbuf_cap = 0
cdef bint _kbuf_busy = False  # a run uses _kbuf (another thread's, entered while it called Python)


cdef int _kbuf_room(KeyBuf* kb, Py_ssize_t need) except -1:
    """Room for ``need`` hashes in ``kb`` (its content kept)."""
    global _kbuf, _kbuf_cap
    cdef Py_ssize_t cap = kb.cap if kb.cap else 256
    cdef uint64_t* p
    if need <= kb.cap:
        return 0
    while cap < need:
        cap *= 2
    p = <uint64_t*>PyMem_Realloc(kb.p, cap * sizeof(uint64_t))
    if p == NULL:
        raise MemoryError()
    kb.p = p
    kb.cap = cap
    if kb.shared:
        _kbuf = p
        _kbuf_cap = cap
    return 0


cdef int _admit(
    list sends,
    object topic_settings,
    object settings_owner,
    object config_of,
    dict tables,
    object order,
    object sent_type,
    object window,
    double now,
    Py_ssize_t max_entries,
    Py_ssize_t per_key,
    Py_ssize_t per_send,
    str name,
    Py_ssize_t max_length,
    dict settings_cache,
    RunCounts* counts,
) except -1:
    """:func:`admit_run`'s work: 2 (recorded, ``counts`` set), 0 (declined: a resend), 1 (the
    reference's case).  ``settings_owner``: an object whose ``topic_settings`` is called on a
    cache miss (when ``topic_settings`` is None: no bound method made per run).

    The run's hashes go to a buffer reused from run to run (no array a send); each recorded
    send's are then kept by its table (``HashTable._keep``)."""
    global _kbuf, _kbuf_cap, _kbuf_busy
    cdef KeyBuf kb
    kb.p = NULL
    kb.cap = 0
    kb.shared = not _kbuf_busy
    if kb.shared:
        kb.p = _kbuf
        kb.cap = _kbuf_cap
        _kbuf_busy = True
    try:
        return _admit_keys(
            sends, topic_settings, settings_owner, config_of, tables, order, sent_type, window,
            now, max_entries, per_key, per_send, name, max_length, settings_cache, counts, &kb
        )
    finally:
        if kb.shared:
            _kbuf_busy = False
            if _kbuf_cap > 65536:  # (a run of more keys than that: not kept for the next)
                PyMem_Free(_kbuf)
                _kbuf = NULL
                _kbuf_cap = 0
        else:
            PyMem_Free(kb.p)


cdef int _admit_keys(
    list sends,
    object topic_settings,
    object settings_owner,
    object config_of,
    dict tables,
    object order,
    object sent_type,
    object window,
    double now,
    Py_ssize_t max_entries,
    Py_ssize_t per_key,
    Py_ssize_t per_send,
    str name,
    Py_ssize_t max_length,
    dict settings_cache,
    RunCounts* counts,
    KeyBuf* kb,
) except -1:
    """:func:`_admit`'s body, the hashes in ``kb``."""
    cdef Py_ssize_t nsends = len(sends)
    cdef Py_ssize_t i, j, n, at, seg, total = 0
    cdef list plan = None  # per send: its record (a SentFields, made in pass 1), or None
    cdef object last_topic = None
    cdef object topic, msgs, send, key, found, cfg, content
    cdef SentFields fields
    cdef double seconds = 0.0
    cdef HashTable table = None
    cdef uint64_t* data
    cdef uint64_t h
    cdef PyObject* value
    cdef tidemq_stem_memo memo
    cdef Py_ssize_t off
    counts.keys = counts.recorded = counts.replaced = counts.displaced = 0
    # Pass 1: the keys and their hashes, each send's record made; each slot prefetched for
    # pass 2 (a full window's table is tens of MB: every key's probe is a cache miss, overlapped
    # this way).
    for i in range(nsends):
        send = sends[i]
        msgs = send.msgs
        n = len(msgs)
        if n == 0:
            continue
        topic = msgs[0].topic
        if last_topic is None or (topic is not last_topic and topic != last_topic):
            cfg = config_of(topic)
            found = settings_cache.get(topic) if settings_cache is not None else None
            if type(found) is tuple and len(<tuple>found) == 3 and (<tuple>found)[0] is cfg:
                seconds = (<tuple>found)[1]
                content = (<tuple>found)[2]
            else:
                if topic_settings is not None:
                    found = topic_settings(topic, cfg)
                else:
                    found = settings_owner.topic_settings(topic, cfg)
                seconds = found[0]
                content = found[1]
            if seconds > 0 and content:
                return 1
            found = tables.get(topic)
            table = <HashTable>found if found is not None else None
            last_topic = topic
        if seconds <= 0:
            continue
        _kbuf_room(kb, total + n)
        data = kb.p + total
        memo.p = NULL  # (the keys of this send are held by its messages through the pass)
        for j in range(n):
            key = _key_of(msgs[j], name, max_length)
            if key is None:
                break  # a message without a usable key: the send is stored as it is
            data[j] = <uint64_t>_hash_key_m(key, &memo)
            if table is not None:
                table._prefetch(_slot_hash(<int64_t>data[j]))
        else:
            if n > max_entries:
                return 1  # a send the window cannot keep (a tiny bound): the reference's case
            fields = SentFields.__new__(sent_type)  # no __init__ call: the fields set here
            fields.window = window
            fields.topic = last_topic  # (equal to this send's topic)
            fields._nkeys = <uint32_t>n
            fields.deadline = now + seconds
            fields.send = send
            fields.handle = None
            if plan is None:
                plan = [None] * nsends
            plan[i] = fields
            total += n
    if total == 0:
        return 2
    # Pass 2: check and record each key in one probe.
    cdef Py_ssize_t keys = 0, recorded = 0, replaced = 0
    cdef list taken = None  # (table, hash, the expired Sent it replaced): restored on a decline
    cdef uint64_t gkey  # the group of the last run key stored in this send's segment (0: none)
    cdef uint32_t gpresent = 0, bit  # that group's keys held (its segments' masks, ours included)
    cdef Py_ssize_t gseg = -1  # this send's segment of it
    last_topic = None
    table = None
    off = 0
    for i in range(nsends):
        entry = plan[i]
        if entry is None:
            continue
        fields = <SentFields>entry
        n = fields._nkeys
        topic = fields.topic
        if topic is not last_topic:
            found = tables.get(topic)
            if found is None:
                found = HashTable()
                tables[topic] = found
            table = <HashTable>found
            last_topic = topic
        data = kb.p + off
        off += n
        gkey = 0
        for j in range(n):
            h = _slot_hash(<int64_t>data[j])
            if gkey != 0 and (h & ~TIDEMQ_GROUP_LOW) == gkey:
                # the next key of the group whose keys were gathered at its first key: absent
                # (its bit in no segment) joins this send's segment without a probe
                bit = 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
                if not (gpresent & bit):
                    table._masks[table._slots[gseg].idx & table._rmask] |= bit
                    table._used += 1
                    gpresent |= bit
                    continue
            gkey = 0
            if (table._nslots + 1) * _LOAD > table._mask + 1:
                table._grow()
            table._reserve()
            at = table._slot_for(h, <PyObject*>fields, &counts.displaced, &seg, &gpresent)
            if at >= 0:
                old = <object>table._value_at(at)
                if _deadline(old) > now:  # a resend, or a key twice in the run
                    _undo(plan, tables, i, j, taken, kb.p)
                    return 0
                if taken is None:
                    taken = []
                taken.append((table, h, old))  # an expired key, taken over (taken holds it)
                replaced += 1
                table._retake(at, h, fields, &counts.displaced)
            else:
                table._store(at, h, fields, seg)
                if h & TIDEMQ_RUN_BIT:  # the group's keys are gathered: its next keys go faster
                    gkey = h & ~TIDEMQ_GROUP_LOW
                    gseg = seg if seg >= 0 else -1 - at
                    gpresent |= 1u << <uint32_t>(h & TIDEMQ_GROUP_LOW)
    append = order.append
    last_topic = None
    off = 0
    for i in range(nsends):
        entry = plan[i]
        if entry is None:
            continue
        fields = <SentFields>entry
        n = fields._nkeys
        topic = fields.topic
        if topic is not last_topic:
            table = <HashTable>tables[topic]
            last_topic = topic
        table._keep(fields, kb.p + off, n)
        off += n
        fields.nbytes = n * per_key + per_send
        append(fields)
        sends[i].dedup = fields
        keys += n
        recorded += 1
    counts.keys = keys
    counts.recorded = recorded
    counts.replaced = replaced
    return 2


cdef inline double _deadline(object sent) except? -1.0:
    if isinstance(sent, SentFields):
        return (<SentFields>sent).deadline
    return sent.deadline


def trim(
    object order,
    dict tables not None,
    double now,
    Py_ssize_t max_entries,
    Py_ssize_t max_bytes,
    Py_ssize_t entries,
    Py_ssize_t nbytes,
    Py_ssize_t per_key,
    Py_ssize_t per_send,
):
    """``DuplicateWindow._trim`` in one call: pop the sends of ``order`` (a deque of
    :class:`SentFields`, oldest first) past their deadline, then the oldest while ``entries`` or
    ``nbytes`` is over its bound; each one's keys still its own leave its topic's table (a table
    left empty leaves ``tables``).  Returns ``(entries, nbytes, evicted)``: the counts after, and
    how many sends left before their deadline."""
    cdef Py_ssize_t evicted = 0
    _trim(order, tables, now, max_entries, max_bytes, &entries, &nbytes, per_key, per_send, &evicted)
    return entries, nbytes, evicted


cdef int _trim(
    object order,
    dict tables,
    double now,
    Py_ssize_t max_entries,
    Py_ssize_t max_bytes,
    Py_ssize_t* entries,
    Py_ssize_t* nbytes,
    Py_ssize_t per_key,
    Py_ssize_t per_send,
    Py_ssize_t* evicted,
) except -1:
    """:func:`trim`'s work, on the counts in place."""
    cdef Py_ssize_t removed
    cdef SentFields sent
    cdef HashTable table
    popleft = order.popleft
    while len(order):
        first = order[0]
        if not isinstance(first, SentFields):
            raise TypeError(f"the window's order holds a {type(first).__name__}")
        sent = <SentFields>first
        if not (sent.deadline <= now or entries[0] > max_entries or nbytes[0] > max_bytes):
            break
        popleft()
        if sent.deadline > now:
            evicted[0] += 1
        if not sent.live:
            continue  # forgotten earlier (not stored): its keys left then
        sent.live = False
        found = tables.get(sent.topic)
        removed = 0
        if isinstance(found, HashTable):
            table = <HashTable>found
            # its keys are the ring's tail: no slot touched
            removed = table._evict(sent)
            if table._used == 0:
                del tables[sent.topic]
        entries[0] -= removed
        nbytes[0] -= removed * per_key + per_send
    return 0


cdef class WindowFields:
    """The duplicate window's counters and the settings its run check reads
    (:class:`tidemq.broker.dedup.DuplicateWindow` adds the rest), typed, so that
    :meth:`admit_run`, the send lane's call per run, is one compiled call: the run checked and
    recorded, the counters updated and the oldest sends evicted, with no Python frame between."""

    cdef public Py_ssize_t entries
    cdef public Py_ssize_t nbytes
    cdef public Py_ssize_t evicted
    cdef public Py_ssize_t max_entries
    cdef public Py_ssize_t max_bytes
    cdef public dict _topics
    cdef public object _order
    cdef public dict _topic_windows
    cdef public object _clock
    cdef public object epoch_source
    cdef public object _rebuilding
    #: Not None: runs are checked by the compiled code (None: ``admit_run_py``, the reference).
    cdef public object _compiled_run
    cdef public object _compiled_trim
    cdef object _sent_type
    cdef Py_ssize_t _per_key
    cdef Py_ssize_t _per_send
    cdef str _key_name
    cdef Py_ssize_t _max_key_length

    def configure_run(self, sent_type, Py_ssize_t per_key, Py_ssize_t per_send, str name not None,
                      Py_ssize_t max_length):
        """The record type and constants the compiled run uses (set once, at the window's start)."""
        self._sent_type = sent_type
        self._per_key = per_key
        self._per_send = per_send
        self._key_name = name
        self._max_key_length = max_length

    def admit_run(self, sends, config_of):
        """The window over a run of prepared sends (the compiled send lane's), as the handler's
        ``prepare``/``prepare_batch`` use it: False (nothing recorded: the handler serves the
        run) when a send is a resend the window holds or repeats a key of the run; else True,
        every send whose messages all have a usable key recorded (``send.dedup``), pending until
        stored.  ``config_of(topic)``: the topic's config (for ``topic_settings``).

        Checked, recorded, counted and trimmed in this one compiled call; ``admit_run_py`` is the
        reference, and serves runs to a topic keyed on content.  False while a rebuild runs."""
        cdef RunCounts c
        cdef int verdict
        if self.epoch_source is not None:
            self._follow_epoch()
        if self._rebuilding is not None:
            return False  # the handler waits for it (serving, wait_rebuilt)
        cdef double now = self._clock()
        if self._compiled_run is None or type(sends) is not list or self._sent_type is None:
            return self.admit_run_py(sends, config_of, now)
        verdict = _admit(
            <list>sends, None, self, config_of, self._topics, self._order, self._sent_type, self,
            now, self.max_entries, self._per_key, self._per_send, self._key_name,
            self._max_key_length, self._topic_windows, &c
        )
        if verdict == 0:
            self.entries -= c.displaced
            self.nbytes -= c.displaced * self._per_key
            return False
        if verdict == 1:
            return self.admit_run_py(sends, config_of, now)
        self.entries += c.keys - c.replaced - c.displaced
        self.nbytes += (c.keys - c.replaced - c.displaced) * self._per_key + c.recorded * self._per_send
        order = self._order
        if len(order) == 0:
            return True
        first = order[0]
        if (self.entries > self.max_entries or self.nbytes > self.max_bytes
                or _deadline(first) <= now):
            _trim(order, self._topics, now, self.max_entries, self.max_bytes, &self.entries,
                  &self.nbytes, self._per_key, self._per_send, &self.evicted)
        return True


cdef int _undo(list plan, dict tables, Py_ssize_t upto, Py_ssize_t upto_key, list taken,
               const uint64_t* keys) except -1:
    """Pass 2 declined at send ``upto``'s key ``upto_key``: remove what it recorded before, and
    put back the expired keys it took over.  ``keys``: the run's hashes (the recorded sends'
    one after another)."""
    cdef Py_ssize_t i, j, n, at, off = 0
    cdef HashTable table
    cdef SentFields sent
    cdef PyObject* value
    cdef uint64_t h
    for i in range(upto + 1):
        entry = plan[i]
        if entry is None:
            continue
        sent = <SentFields>entry
        n = sent._nkeys if i < upto else upto_key  # the declining send: its keys before upto_key
        table = <HashTable>tables[sent.topic]
        off += sent._nkeys
        for j in range(n):
            h = _slot_hash(<int64_t>keys[off - sent._nkeys + j])
            at = table._find(h)
            if at >= 0 and table._value_at(at) == <PyObject*>sent:
                table._remove_key(at, h)
    if taken is not None:
        for item in taken:
            (<HashTable>(<tuple>item)[0])._put((<tuple>item)[1], (<tuple>item)[2])
    return 0
