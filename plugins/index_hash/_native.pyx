# cython: language_level=3, boundscheck=True, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""Compiled per-key work of the ``hash`` index (issue 19): key hashing and IndexFile insertion.

Same names, arguments and results as the pure-Python reference in
:mod:`tidemq_index_hash.indexfile`: :func:`key_hash` (``py_key_hash``), :func:`hash_batch`
(``py_hash_batch``) and :func:`put_batch` (``IndexFile.py_put_batch``).  The index files written
are byte for byte the reference's (``tests/test_native_index.py`` checks it).
:mod:`tidemq_index_hash.native` loads this module unless ``TIDEMQ_NO_EXTENSIONS`` is set.

The hash.  The index hash of ``topic#key`` is the first 4 bytes of its BLAKE3 digest (read
big-endian, 31 bits).  Keys are short, so their input is one BLAKE3 chunk (at most 1024 bytes),
whose root output is its last block's compression: that case is computed here, in C, written from
the BLAKE3 specification (no tree, no SIMD; 4-6x cheaper than calling the ``blake3`` package
per key, ``bench/index_bench.py --sections hash``).  Longer inputs call the package (its
``blake3`` callable, cached).  The C hash is compared with the package at import; a mismatch
raises ImportError, so the loader falls back to the reference.

Bounds: the module is compiled with ``boundscheck=True``, so indexing a Python sequence out of
range raises IndexError as in Python (the arrays and buffers are read through raw pointers within
lengths checked beforehand).

Errors: inputs the fast path does not take (a property that is not a string, a string that does
not encode to UTF-8, a sequence of another kind...) are handed to the reference, which raises
its own exception or returns its result.
"""

from cpython.array cimport array, clone, resize, resize_smart
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItemWithError
from cpython.long cimport PyLong_AsLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.sequence cimport PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from libc.errno cimport EINTR
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy
from posix.fcntl cimport posix_fallocate

import array as _array

import blake3 as _blake3

cdef extern from "Python.h":
    # Raw declarations: NULL is handled here, not turned into an exception by Cython.
    const char *raw_as_utf8 "PyUnicode_AsUTF8AndSize"(object u, Py_ssize_t *size)
    ctypedef struct PyThreadState:
        pass
    PyThreadState *PyEval_SaveThread()
    void PyEval_RestoreThread(PyThreadState *state)
    void PyErr_Clear()

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    /* BLAKE3, one chunk (input of at most 1024 bytes), written from the specification:
       https://github.com/BLAKE3-team/BLAKE3-specs (compression function, chunk chaining). */
    #define TQI_CHUNK_LEN 1024
    #define TQI_CHUNK_START 1u
    #define TQI_CHUNK_END 2u
    #define TQI_ROOT 8u

    static const uint32_t tqi_iv[8] = {
        0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
        0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u,
    };
    /* Message word order of each of the 7 rounds (round r applies the specification's permutation
       r times), as constants: with the rounds written out below the compiler reads every message
       word from a register, no table load per word. */
    static const uint8_t tqi_order[7][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
        {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
        {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
        {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
        {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
        {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
        {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
    };

    static inline uint32_t tqi_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

    static inline uint32_t tqi_le32(const uint8_t *p) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }

    #define TQI_MIX(a, b, c, d, x, y) do {                               \
            v[a] += v[b] + (x); v[d] = tqi_rotr(v[d] ^ v[a], 16);        \
            v[c] += v[d];       v[b] = tqi_rotr(v[b] ^ v[c], 12);        \
            v[a] += v[b] + (y); v[d] = tqi_rotr(v[d] ^ v[a], 8);         \
            v[c] += v[d];       v[b] = tqi_rotr(v[b] ^ v[c], 7);         \
        } while (0)

    /* One round, its word order a constant (the macro's r is a literal). */
    #define TQI_ROUND(r) do {                                                            \
            TQI_MIX(0, 4, 8, 12, m[tqi_order[r][0]], m[tqi_order[r][1]]);                 \
            TQI_MIX(1, 5, 9, 13, m[tqi_order[r][2]], m[tqi_order[r][3]]);                 \
            TQI_MIX(2, 6, 10, 14, m[tqi_order[r][4]], m[tqi_order[r][5]]);                \
            TQI_MIX(3, 7, 11, 15, m[tqi_order[r][6]], m[tqi_order[r][7]]);                \
            TQI_MIX(0, 5, 10, 15, m[tqi_order[r][8]], m[tqi_order[r][9]]);                \
            TQI_MIX(1, 6, 11, 12, m[tqi_order[r][10]], m[tqi_order[r][11]]);              \
            TQI_MIX(2, 7, 8, 13, m[tqi_order[r][12]], m[tqi_order[r][13]]);               \
            TQI_MIX(3, 4, 9, 14, m[tqi_order[r][14]], m[tqi_order[r][15]]);               \
        } while (0)

    /* Compress one 64-byte block of chunk 0 into the chaining value cv (in place). */
    static void tqi_compress(uint32_t cv[8], const uint8_t *block, uint32_t block_len, uint32_t flags) {
        uint32_t m[16], v[16];
        for (int i = 0; i < 16; i++) m[i] = tqi_le32(block + 4 * i);
        for (int i = 0; i < 8; i++) v[i] = cv[i];
        v[8] = tqi_iv[0]; v[9] = tqi_iv[1]; v[10] = tqi_iv[2]; v[11] = tqi_iv[3];
        v[12] = 0; v[13] = 0;  /* the chunk counter: a single chunk is chunk 0 */
        v[14] = block_len; v[15] = flags;
        TQI_ROUND(0); TQI_ROUND(1); TQI_ROUND(2); TQI_ROUND(3); TQI_ROUND(4); TQI_ROUND(5); TQI_ROUND(6);
        for (int i = 0; i < 8; i++) cv[i] = v[i] ^ v[i + 8];
    }

    /* The index hash of len <= TQI_CHUNK_LEN bytes: digest bytes 0..3 (the root output's first
       word, little-endian) read as a big-endian int, top bit cleared. */
    static int32_t tqi_hash(const uint8_t *data, size_t len) {
        uint32_t cv[8];
        uint8_t last[64];
        size_t blocks = len ? (len + 63) / 64 : 1;
        memcpy(cv, tqi_iv, sizeof cv);
        for (size_t b = 0; b < blocks; b++) {
            size_t off = b * 64, n = len - off;
            uint32_t flags = (b == 0 ? TQI_CHUNK_START : 0) | (b + 1 == blocks ? TQI_CHUNK_END | TQI_ROOT : 0);
            const uint8_t *block = data + off;
            if (n >= 64) {
                n = 64;
            } else {  /* the last block, zero-padded */
                memset(last, 0, sizeof last);
                if (n) memcpy(last, data + off, n);
                block = last;
            }
            tqi_compress(cv, block, (uint32_t)n, flags);
        }
        uint32_t w = cv[0];
        uint32_t be = ((w & 0xFFu) << 24) | ((w & 0xFF00u) << 8) | ((w >> 8) & 0xFF00u) | (w >> 24);
        return (int32_t)(be & 0x7FFFFFFFu);
    }

    /* TQI_LANES keys of one block each (at most 64 bytes) hashed side by side: the same
       compression as tqi_compress, each 32-bit word of the state a vector of TQI_LANES words,
       one lane per key (GCC's vector extension: SSE2 or AVX2 on x86-64, NEON on arm64, plain
       words elsewhere).  A put's keys (client message ids, ~45 bytes with the topic) are all one
       block, so a chunk's hashing is mostly these.  tests/test_native_index.py compares each
       lane with tqi_hash. */
    #define TQI_LANES 8
    #define TQI_BLOCK 64
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
    #if __has_attribute(target_clones)
    #define TQI_CLONES __attribute__((target_clones("avx2", "default")))
    #endif
    #endif
    #ifndef TQI_CLONES
    #define TQI_CLONES
    #endif
    #if defined(__GNUC__)
    #define TQI_VECTORS 1
    typedef uint32_t tqi_vec __attribute__((vector_size(4 * TQI_LANES)));

    #define TQI_VROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
    #define TQI_VMIX(a, b, c, d, x, y) do {                                   \
            v[a] += v[b] + (x); v[d] = TQI_VROTR(v[d] ^ v[a], 16);           \
            v[c] += v[d];       v[b] = TQI_VROTR(v[b] ^ v[c], 12);           \
            v[a] += v[b] + (y); v[d] = TQI_VROTR(v[d] ^ v[a], 8);            \
            v[c] += v[d];       v[b] = TQI_VROTR(v[b] ^ v[c], 7);            \
        } while (0)
    #define TQI_VROUND(r) do {                                                           \
            TQI_VMIX(0, 4, 8, 12, m[tqi_order[r][0]], m[tqi_order[r][1]]);                \
            TQI_VMIX(1, 5, 9, 13, m[tqi_order[r][2]], m[tqi_order[r][3]]);                \
            TQI_VMIX(2, 6, 10, 14, m[tqi_order[r][4]], m[tqi_order[r][5]]);               \
            TQI_VMIX(3, 7, 11, 15, m[tqi_order[r][6]], m[tqi_order[r][7]]);               \
            TQI_VMIX(0, 5, 10, 15, m[tqi_order[r][8]], m[tqi_order[r][9]]);               \
            TQI_VMIX(1, 6, 11, 12, m[tqi_order[r][10]], m[tqi_order[r][11]]);             \
            TQI_VMIX(2, 7, 8, 13, m[tqi_order[r][12]], m[tqi_order[r][13]]);              \
            TQI_VMIX(3, 4, 9, 14, m[tqi_order[r][14]], m[tqi_order[r][15]]);              \
        } while (0)

    /* out[j] = tqi_hash(data[j], len[j]) for the TQI_LANES keys, each len[j] <= TQI_BLOCK. */
    TQI_CLONES static void tqi_hash_lanes(const uint8_t *const *data, const size_t *len, int32_t *out) {
        uint8_t blocks[TQI_LANES][TQI_BLOCK];
        uint32_t words[16][TQI_LANES], lens[TQI_LANES];
        tqi_vec m[16], v[16], w;
        memset(blocks, 0, sizeof blocks);
        for (int j = 0; j < TQI_LANES; j++) {
            if (len[j]) memcpy(blocks[j], data[j], len[j]);
            lens[j] = (uint32_t)len[j];
            for (int i = 0; i < 16; i++) words[i][j] = tqi_le32(blocks[j] + 4 * i);
        }
        for (int i = 0; i < 16; i++) memcpy(&m[i], words[i], sizeof m[i]);
        for (int i = 0; i < 8; i++) v[i] = (tqi_vec){0} + tqi_iv[i];  /* the chaining value: the IV */
        for (int i = 0; i < 4; i++) v[i + 8] = (tqi_vec){0} + tqi_iv[i];
        v[12] = v[13] = (tqi_vec){0};  /* the chunk counter: chunk 0 */
        memcpy(&v[14], lens, sizeof v[14]);
        v[15] = (tqi_vec){0} + (TQI_CHUNK_START | TQI_CHUNK_END | TQI_ROOT);
        TQI_VROUND(0); TQI_VROUND(1); TQI_VROUND(2); TQI_VROUND(3); TQI_VROUND(4); TQI_VROUND(5); TQI_VROUND(6);
        w = v[0] ^ v[8];  /* the root output's first word; v[8..11] started as the IV's first four */
        for (int j = 0; j < TQI_LANES; j++) {
            uint32_t x = w[j];
            uint32_t be = ((x & 0xFFu) << 24) | ((x & 0xFF00u) << 8) | ((x >> 8) & 0xFF00u) | (x >> 24);
            out[j] = (int32_t)(be & 0x7FFFFFFFu);
        }
    }
    #else
    #define TQI_VECTORS 0
    static void tqi_hash_lanes(const uint8_t *const *data, const size_t *len, int32_t *out) {
        for (int j = 0; j < TQI_LANES; j++) out[j] = tqi_hash(data[j], len[j]);
    }
    #endif

    /* Big-endian fields of the index file. */
    static inline int32_t tqi_get32(const uint8_t *p) {
        return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
    }
    static inline void tqi_put32(uint8_t *p, uint32_t v) {
        p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
    }
    static inline void tqi_put64(uint8_t *p, uint64_t v) {
        tqi_put32(p, (uint32_t)(v >> 32)); tqi_put32(p + 4, (uint32_t)v);
    }
    /* Ask for a slot's cache line ahead of its write: a batch's slots are random in a table of
       megabytes, so each one is a cache (and TLB) miss; a few in flight overlap their waits. */
    static inline void tqi_prefetch_w(const uint8_t *p) { __builtin_prefetch(p, 1, 1); }
    """
    int TQI_CHUNK_LEN
    int32_t tqi_hash(const uint8_t *data, size_t length) nogil
    enum: TQI_LANES
    enum: TQI_BLOCK
    int TQI_VECTORS
    void tqi_hash_lanes(const uint8_t *const *data, const size_t *len, int32_t *out) nogil
    int32_t tqi_get32(const uint8_t *p) nogil
    void tqi_put32(uint8_t *p, uint32_t v) nogil
    void tqi_put64(uint8_t *p, unsigned long long v) nogil
    void tqi_prefetch_w(const uint8_t *p) nogil


#: Where the hash is computed (``tidemq_index_hash.native.DESCRIPTION`` shows it).
HASH_SOURCE = (
    "blake3: one chunk in C (keys of one block %d at a time%s), the blake3 package beyond 1024 bytes"
    % (TQI_LANES, ", vectors" if TQI_VECTORS else "")
)

cdef enum:
    # The file layout (tidemq_index_hash.indexfile; tests/test_native_index.py checks they agree).
    HEADER_SIZE = 40
    SLOT_SIZE = 4
    ENTRY_SIZE = 20
    SLOT_CHUNK = 65536
    SLOT_CHUNK_SHIFT = 16
    ENTRY_WINDOW = 262144
    # Keys a call needs before it releases the GIL (for the hashing, for the insertion), unless the
    # caller says otherwise (``gil_release_keys``): below it the work (~0.2 us a key) is shorter
    # than a hand-over of the GIL to the event loop and back.
    NOGIL_MIN = 64
    PREFETCH_AHEAD = 8  # keys whose slot lines are requested before the current key's write
    INT_MAX = 0x7FFFFFFF
    # tidemq.message's transaction type bits of the sys flag, and the rolled-back type.
    TRANSACTION_TYPE_MASK = 0xC
    TRANSACTION_ROLLBACK_TYPE = 0xC
    SPACE = 32  # b" "
    HASH_SIGN = 35  # b"#"

#: The constants above, for the test that compares them with the reference's.
LAYOUT = {
    "HEADER_SIZE": HEADER_SIZE,
    "SLOT_SIZE": SLOT_SIZE,
    "ENTRY_SIZE": ENTRY_SIZE,
    "SLOT_CHUNK": SLOT_CHUNK,
    "ENTRY_WINDOW": ENTRY_WINDOW,
    "TRANSACTION_TYPE_MASK": TRANSACTION_TYPE_MASK,
    "TRANSACTION_ROLLBACK_TYPE": TRANSACTION_ROLLBACK_TYPE,
}

cdef object _package_blake3 = _blake3.blake3  # the cached callable, for inputs beyond one chunk
cdef array _int_template = _array.array("i")
cdef str _KEYS = "KEYS"
cdef str _UNIQ_KEY = "UNIQ_KEY"


cdef int32_t _package_hash(bytes data) except -1:
    return int.from_bytes(_package_blake3(data).digest(4), "big") & INT_MAX


cdef int32_t _hash2(const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen) except -1:
    """The index hash of the bytes ``a + b`` (``topic#`` and a key)."""
    cdef uint8_t buf[1024]
    cdef Py_ssize_t n = alen + blen
    cdef bytes joined
    if n <= TQI_CHUNK_LEN:
        if alen:
            memcpy(buf, a, alen)
        if blen:
            memcpy(buf + alen, b, blen)
        return tqi_hash(buf, n)
    joined = PyBytes_FromStringAndSize(NULL, n)
    if alen:
        memcpy(PyBytes_AS_STRING(joined), a, alen)
    if blen:
        memcpy(PyBytes_AS_STRING(joined) + alen, b, blen)
    return _package_hash(joined)


def bytes_hash(const uint8_t[::1] data not None) -> int:
    """The index hash of raw bytes (the digest prefix :func:`key_hash` uses)."""
    if data.shape[0] <= TQI_CHUNK_LEN:
        return tqi_hash(&data[0] if data.shape[0] else NULL, data.shape[0])
    return _package_hash(bytes(data))


def key_hash(str key not None) -> int:
    """:func:`tidemq_index_hash.indexfile.py_key_hash`: the index hash of ``key`` (``topic#key``)."""
    cdef Py_ssize_t n
    cdef const char *p = raw_as_utf8(key, &n)
    if p == NULL:  # lone surrogates: the reference raises its UnicodeEncodeError
        PyErr_Clear()
        return _reference().py_key_hash(key)
    return _hash2(p, n, NULL, 0)


def package_key_hash(str key not None) -> int:
    """:func:`key_hash` through the ``blake3`` package, called from here (the benchmark's baseline)."""
    return _package_hash(key.encode())


def _reference():
    from tidemq_index_hash import indexfile  # imported when needed: indexfile imports this module

    return indexfile


cdef class _Gather:
    """Key hashes of puts, in two passes: the keys (``topic#key``, UTF-8) are copied into one C
    buffer under the GIL (:meth:`add`), then hashed without it (:meth:`finish`): the event loop
    runs meanwhile, and nothing Python is read there.  A key beyond one chunk is hashed as it is
    added (the blake3 package), its end noted as -1."""

    cdef array hashes, counts
    cdef Py_ssize_t used, nmsgs, cap, keys_cap, keys_used
    cdef Py_ssize_t *ends
    cdef uint8_t *keys

    def __cinit__(self, Py_ssize_t expected):
        self.hashes = clone(_int_template, expected, False)
        self.counts = clone(_int_template, expected, False)
        self.cap = expected
        self.ends = <Py_ssize_t *>PyMem_Malloc((expected if expected else 1) * sizeof(Py_ssize_t))
        if self.ends == NULL:
            raise MemoryError()

    def __dealloc__(self):
        PyMem_Free(self.ends)
        PyMem_Free(self.keys)

    cdef int _room(self) except -1:
        cdef Py_ssize_t size = 2 * self.used + 16
        cdef Py_ssize_t *grown
        if self.used < self.cap:
            return 0
        resize_smart(self.hashes, size)
        grown = <Py_ssize_t *>PyMem_Realloc(self.ends, size * sizeof(Py_ssize_t))
        if grown == NULL:
            raise MemoryError()
        self.ends = grown
        self.cap = size
        return 0

    cdef int _count(self, int32_t c) except -1:
        if self.nmsgs == len(self.counts):
            resize_smart(self.counts, 2 * self.nmsgs + 16)
        self.counts.data.as_ints[self.nmsgs] = c
        self.nmsgs += 1
        return 0

    cdef int _hashed(self, int32_t h) except -1:
        self._room()
        self.hashes.data.as_ints[self.used] = h
        self.ends[self.used] = -1
        self.used += 1
        return 0

    cdef int _key(self, const char *t, Py_ssize_t tlen, const char *k, Py_ssize_t klen) except -1:
        cdef Py_ssize_t size = self.keys_cap, need = self.keys_used + tlen + klen
        cdef uint8_t *grown
        if tlen + klen > TQI_CHUNK_LEN:
            return self._hashed(_hash2(t, tlen, k, klen))
        if need > size:
            while size < need:
                size = 2 * size + 1024
            grown = <uint8_t *>PyMem_Realloc(self.keys, size)
            if grown == NULL:
                raise MemoryError()
            self.keys = grown
            self.keys_cap = size
        self._room()
        memcpy(self.keys + self.keys_used, t, tlen)
        memcpy(self.keys + self.keys_used + tlen, k, klen)
        self.keys_used = need
        self.ends[self.used] = need
        self.used += 1
        return 0

    cdef int add(self, str topic, properties, sys_flags, Py_ssize_t skip_before) except -1:
        """Gather one put's keys; 1 (and nothing gathered) when the reference must take it."""
        cdef Py_ssize_t n, i, tlen, klen, start, j
        cdef Py_ssize_t used0 = self.used, nmsgs0 = self.nmsgs, keys0 = self.keys_used
        cdef const char *t
        cdef const char *k
        cdef int32_t c
        cdef long flag
        cdef int overflow
        cdef PyObject *value
        cdef bytes prefix
        if type(properties) is not list and type(properties) is not tuple:
            return 1
        if type(sys_flags) is not list and type(sys_flags) is not tuple:
            return 1
        n = len(properties)
        if len(sys_flags) != n:
            return 1
        t = raw_as_utf8(topic, &tlen)
        if t == NULL:
            PyErr_Clear()
            return 1
        prefix = PyBytes_FromStringAndSize(NULL, tlen + 1)  # "topic#"
        memcpy(PyBytes_AS_STRING(prefix), t, tlen)
        PyBytes_AS_STRING(prefix)[tlen] = HASH_SIGN
        t = PyBytes_AS_STRING(prefix)
        tlen += 1
        for i in range(n):
            # Both are lists or tuples (checked above); their length is read again each time, as
            # a call into Python below (the blake3 package, for a long key) could change a list.
            if i >= PySequence_Fast_GET_SIZE(properties) or i >= PySequence_Fast_GET_SIZE(sys_flags):
                break
            props = <object>PySequence_Fast_GET_ITEM(properties, i)
            flag_obj = <object>PySequence_Fast_GET_ITEM(sys_flags, i)
            if type(props) is not dict or type(flag_obj) is not int:
                break
            flag = PyLong_AsLongAndOverflow(flag_obj, &overflow)
            if overflow:
                break
            if i < skip_before or (flag & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE:
                self._count(-1)
                continue
            c = 0
            # Strong references (key_obj): the buffers read below must outlive a call into Python
            # (the blake3 package, for a key beyond one chunk), whatever another thread does meanwhile.
            value = PyDict_GetItemWithError(props, _UNIQ_KEY)
            if value != NULL and <object>value is not None:
                key_obj = <object>value
                if type(key_obj) is not str:
                    break
                k = raw_as_utf8(key_obj, &klen)
                if k == NULL:
                    PyErr_Clear()
                    break
                if klen:
                    self._key(t, tlen, k, klen)
                    c += 1
            value = PyDict_GetItemWithError(props, _KEYS)
            if value != NULL and <object>value is not None:
                key_obj = <object>value
                if type(key_obj) is not str:
                    break
                k = raw_as_utf8(key_obj, &klen)
                if k == NULL:
                    PyErr_Clear()
                    break
                # str.split(" "): a space byte never occurs inside a UTF-8 multi-byte sequence.
                start = 0
                for j in range(klen + 1):
                    if j == klen or k[j] == SPACE:
                        if j > start:
                            self._key(t, tlen, k + start, j - start)
                            c += 1
                        start = j + 1
            self._count(c)
        else:
            return 0
        self.used, self.nmsgs, self.keys_used = used0, nmsgs0, keys0  # the reference takes it
        return 1

    cdef int add_reference(self, hashes, counts) except -1:
        """Append what the reference computed for a put."""
        for h in hashes:
            self._hashed(h)
        for c in counts:
            self._count(c)
        return 0

    cdef tuple finish(self, Py_ssize_t release_min):
        """Hash what was gathered (the GIL released from ``release_min`` keys on; 0: never)."""
        cdef int *out = self.hashes.data.as_ints
        cdef const Py_ssize_t *ends = self.ends
        cdef const uint8_t *keys = self.keys
        cdef Py_ssize_t n = self.used
        # The arrays and buffers are this object's own: no other thread sees them.
        if 0 < release_min <= n:
            with nogil:
                _hash_gathered(out, ends, n, keys)
        else:
            _hash_gathered(out, ends, n, keys)
        resize(self.hashes, self.used)
        resize(self.counts, self.nmsgs)
        return self.hashes, self.counts


cdef void _hash_gathered(int *out, const Py_ssize_t *ends, Py_ssize_t n, const uint8_t *keys) noexcept nogil:
    """Hash the gathered keys: those of one block TQI_LANES at a time (``tqi_hash_lanes``), the
    rest and the last incomplete group one by one (``tqi_hash``)."""
    cdef Py_ssize_t i, j, start = 0, length
    cdef int lanes = 0
    cdef const uint8_t *data[TQI_LANES]
    cdef size_t lens[TQI_LANES]
    cdef Py_ssize_t where[TQI_LANES]
    cdef int32_t hashed[TQI_LANES]
    for i in range(n):
        if ends[i] < 0:
            continue  # hashed as it was added (beyond one chunk)
        length = ends[i] - start
        if length <= TQI_BLOCK:
            data[lanes] = keys + start
            lens[lanes] = <size_t>length
            where[lanes] = i
            lanes += 1
            if lanes == TQI_LANES:
                tqi_hash_lanes(data, lens, hashed)
                for j in range(TQI_LANES):
                    out[where[j]] = hashed[j]
                lanes = 0
        else:
            out[i] = tqi_hash(keys + start, length)
        start = ends[i]
    for j in range(lanes):
        out[where[j]] = tqi_hash(data[j], lens[j])


def hash_lanes_check(keys):
    """The hashes of ``keys`` (bytes of at most 64 each), TQI_LANES at a time through
    ``tqi_hash_lanes`` and one by one through ``tqi_hash``: two lists the tests compare."""
    cdef Py_ssize_t n = len(keys), i, j, base
    cdef const uint8_t *data[TQI_LANES]
    cdef size_t lens[TQI_LANES]
    cdef int32_t hashed[TQI_LANES]
    cdef bytes k
    if n % TQI_LANES:
        raise ValueError(f"hash_lanes_check takes a multiple of {TQI_LANES} keys")
    lanes = []
    for base in range(0, n, TQI_LANES):
        for j in range(TQI_LANES):
            k = keys[base + j]
            if len(k) > TQI_BLOCK:
                raise ValueError("a key of one block is at most 64 bytes")
            data[j] = <const uint8_t *>PyBytes_AS_STRING(k)
            lens[j] = len(k)
        tqi_hash_lanes(data, lens, hashed)
        lanes.extend(hashed[j] for j in range(TQI_LANES))
    single = [tqi_hash(<const uint8_t *>PyBytes_AS_STRING(k), len(k)) for k in keys]
    return lanes, single


def hash_batch(
    str topic not None, properties, sys_flags, Py_ssize_t skip_before, Py_ssize_t gil_release_keys=NOGIL_MIN
):
    """:func:`tidemq_index_hash.indexfile.py_hash_batch`: key hashes of a batch, and their counts.

    The keys are copied into a C buffer under the GIL, then hashed without it (:class:`_Gather`)
    when there are ``gil_release_keys`` of them or more (0: the GIL is kept).  Per call, not a
    setting of the module: two indexes in one process (or a loop and a thread) choose their own.
    """
    cdef Py_ssize_t n = len(properties)
    cdef _Gather g = _Gather(2 * n)
    if g.add(topic, properties, sys_flags, skip_before):
        return _reference().py_hash_batch(topic, properties, sys_flags, skip_before)
    return g.finish(gil_release_keys)


def hash_chunk(batches, Py_ssize_t gil_release_keys=NOGIL_MIN):
    """:func:`tidemq_index_hash.indexfile.py_hash_chunk`: :func:`hash_batch` of several puts
    ``(topic, properties, sys_flags, skip_before)``, concatenated; one release of the GIL for
    the hashing of all of them (from ``gil_release_keys`` keys on; 0: never)."""
    cdef _Gather g = _Gather(256)
    for topic, properties, sys_flags, skip_before in batches:
        if type(topic) is not str:
            raise TypeError(f"hash_chunk: topic {topic!r} is not a str")
        if g.add(topic, properties, sys_flags, skip_before):
            ref_hashes, ref_counts = _reference().py_hash_batch(topic, properties, sys_flags, skip_before)
            g.add_reference(ref_hashes, ref_counts)
    return g.finish(gil_release_keys)


cdef int _reserve(int fd, int64_t start, int64_t length) noexcept nogil:
    """posix_fallocate, retried on EINTR as ``os.posix_fallocate``; 0 or the error number."""
    cdef int err
    while True:
        err = posix_fallocate(fd, start, length)
        if err != EINTR:
            return err


cdef inline int64_t _slot(int32_t h, int64_t slot_num, bint narrow) noexcept nogil:
    """``h % slot_num`` for a hash ``h >= 0`` (callers check it): in 32 bits when the slot count
    fits (always, with the options' bound of 500 000 000), a division several times cheaper."""
    if narrow:
        return <int64_t>((<uint32_t>h) % (<uint32_t>slot_num))
    return h % slot_num


def put_batch(
    f,
    array hashes_array not None,
    array counts_array not None,
    offsets,
    store_timestamp,
    Py_ssize_t msg,
    Py_ssize_t hpos,
    Py_ssize_t gil_release_keys=NOGIL_MIN,
):
    """``IndexFile.put_batch`` (see ``IndexFile.py_put_batch``, the reference): write the entries
    of messages ``msg..`` into ``f``; returns ``(msg, hpos, errno)`` where they stopped.  The
    insertion runs without the GIL when ``gil_release_keys`` or more hashes are left (0: never).

    Everything that can run Python code (attribute reads, the offsets' conversion) happens before
    the raw pointers into the arrays, the bytearray and the mapping are taken; from there to the
    end no Python code runs, so nothing can resize or free what they point into.
    """
    if hashes_array.ob_descr.typecode != b"i" or counts_array.ob_descr.typecode != b"i":
        raise TypeError("put_batch takes array('i') hashes and counts")
    cdef Py_ssize_t n = len(counts_array), nhashes = len(hashes_array), i, k, start, end, p = 0
    cdef Py_ssize_t first_msg
    cdef bint narrow
    cdef int32_t c, prev, h
    cdef int err = 0, fd = f._fd, bad = 0
    cdef PyThreadState *save = NULL
    cdef Py_ssize_t bad_value = 0
    cdef bint full = False
    header = f.header
    cdef int64_t count = header.index_count
    cdef int64_t index_num = f.index_num, slot_num = f.slot_num
    cdef int64_t entry_base = f._entry_base, size = f._size, reserved_end = f._reserved_end
    cdef int64_t begin_ts = header.begin_timestamp, begin_phy = header.begin_phy_offset
    cdef int64_t end_ts = header.end_timestamp, end_phy = header.end_phy_offset
    cdef int64_t ts = 0, off, slot_pos, entry_pos, chunk_start, e, new_end, diff
    mm_obj = f._mm
    slot_chunks = f._slot_chunks
    if type(slot_chunks) is not bytearray:
        raise TypeError("IndexFile._slot_chunks is not a bytearray")
    cdef unsigned char *chunks
    cdef Py_ssize_t nchunks
    cdef Py_buffer view
    cdef uint8_t *mm
    cdef int64_t offs_small[128]
    cdef int64_t *offs = offs_small
    cdef int64_t *tss = offs_small + 64
    cdef bint per_message_ts = type(store_timestamp) is not int
    cdef const int *hashes
    cdef const int *counts
    if n and (msg < 0 or msg > n or hpos < 0):
        raise ValueError(f"put_batch: position ({msg}, {hpos}) outside the batch")
    if n > 64:
        offs = <int64_t *>PyMem_Malloc(2 * n * sizeof(int64_t))
        if offs == NULL:
            raise MemoryError()
        tss = offs + n
    try:
        for i in range(msg, n):
            offs[i] = offsets[i]
        if per_message_ts:  # one store time per message (a chunk of several puts)
            for i in range(msg, n):
                tss[i] = store_timestamp[i]
        else:
            ts = store_timestamp
    except BaseException:
        if offs != offs_small:
            PyMem_Free(offs)
        raise
    # From here on no Python code runs until the finally clause below.
    hashes = hashes_array.data.as_ints
    counts = counts_array.data.as_ints
    chunks = <unsigned char *>PyByteArray_AS_STRING(slot_chunks)
    nchunks = PyByteArray_GET_SIZE(slot_chunks)
    for i in range(msg):
        if counts[i] > 0:
            p += counts[i]
    PyObject_GetBuffer(mm_obj, &view, PyBUF_WRITABLE)
    mm = <uint8_t *>view.buf
    first_msg = msg
    narrow = 0 < slot_num <= 0xFFFFFFFF
    try:
        if view.len < size:
            raise ValueError(f"put_batch: the mapping ({view.len} bytes) is shorter than the file ({size})")
        # The insertion runs without the GIL: everything it reads or writes is a raw pointer into
        # buffers held above (the arrays, the slot-chunk bytearray and the mapping, whose export
        # keeps it mapped), or a local; the index lock, held by the caller, keeps other indexers
        # out.  A bad input is noted in `bad` and raised once the GIL is back.
        # (Released by hand, only when there is enough work: the loop below was written and
        # compiled as a `with nogil` block, so Cython checked that it touches no Python object.)
        if 0 < gil_release_keys <= nhashes - hpos:
            save = PyEval_SaveThread()
        if True:
            while msg < n:
                c = counts[msg]
                if c <= 0:
                    msg += 1
                    continue
                start = hpos if hpos > p else p
                end = p + c
                if end > nhashes:
                    bad = 1
                    break
                if count >= index_num:  # full before this message: the caller rolls to a new file
                    hpos = start
                    break
                # IndexFile.reserve: the message's slots and entries, before anything is written.
                for k in range(start, end):
                    if hashes[k] < 0:  # hash_batch's are 31-bit: a slot outside the table otherwise
                        bad = 2
                        bad_value = hashes[k]
                        break
                    i = (HEADER_SIZE + _slot(hashes[k], slot_num, narrow) * SLOT_SIZE) >> SLOT_CHUNK_SHIFT
                    if i >= nchunks:
                        bad = 3
                        bad_value = i
                        break
                    if not chunks[i]:
                        chunk_start = i * SLOT_CHUNK
                        err = _reserve(fd, chunk_start, min(chunk_start + SLOT_CHUNK, entry_base) - chunk_start)
                        if err:
                            break
                        chunks[i] = 1
                if bad:
                    break
                if not err:
                    e = entry_base + min(count + (end - start), index_num) * ENTRY_SIZE
                    if e > reserved_end:
                        new_end = min(size, max(e, reserved_end) + ENTRY_WINDOW)
                        err = _reserve(fd, reserved_end, new_end - reserved_end)
                        if not err:
                            reserved_end = new_end
                if err:
                    hpos = start
                    break
                off = offs[msg]
                if per_message_ts:
                    ts = tss[msg]
                if msg == first_msg:  # the first lines ahead of the first key written
                    for k in range(start, min(start + PREFETCH_AHEAD, nhashes)):
                        if hashes[k] >= 0:
                            tqi_prefetch_w(mm + HEADER_SIZE + _slot(hashes[k], slot_num, narrow) * SLOT_SIZE)
                # IndexFile.put_key, for each key of the message.
                for k in range(start, end):
                    if count >= index_num:
                        full = True
                        hpos = k
                        break
                    if k + PREFETCH_AHEAD < nhashes and hashes[k + PREFETCH_AHEAD] >= 0:
                        tqi_prefetch_w(
                            mm + HEADER_SIZE + _slot(hashes[k + PREFETCH_AHEAD], slot_num, narrow) * SLOT_SIZE
                        )
                    h = hashes[k]
                    slot_pos = HEADER_SIZE + _slot(h, slot_num, narrow) * SLOT_SIZE
                    entry_pos = entry_base + count * ENTRY_SIZE
                    if entry_pos + ENTRY_SIZE > reserved_end:
                        new_end = min(size, max(entry_pos + ENTRY_SIZE, reserved_end) + ENTRY_WINDOW)
                        err = _reserve(fd, reserved_end, new_end - reserved_end)
                        if err:
                            hpos = k
                            break
                        reserved_end = new_end
                    prev = tqi_get32(mm + slot_pos)
                    if prev <= 0 or prev >= count:
                        prev = 0
                    if count == 1:
                        begin_ts = ts
                        begin_phy = off
                    diff = ts - begin_ts
                    diff = 0 if diff < 0 else min(diff // 1000, INT_MAX)
                    tqi_put32(mm + entry_pos, <uint32_t>h)
                    tqi_put64(mm + entry_pos + 4, <unsigned long long>off)
                    tqi_put32(mm + entry_pos + 12, <uint32_t>diff)
                    tqi_put32(mm + entry_pos + 16, <uint32_t>prev)
                    tqi_put32(mm + slot_pos, <uint32_t>count)
                    count += 1
                    end_ts = ts
                    end_phy = off
                if full or err:
                    break
                p = end
                hpos = end
                msg += 1
        if save != NULL:
            PyEval_RestoreThread(save)
            save = NULL
        if bad == 1:
            raise ValueError("put_batch: counts add up to more than the hashes given")
        if bad == 2:
            raise ValueError(f"put_batch: hash {bad_value} is negative")
        if bad == 3:
            raise ValueError(f"put_batch: slot chunk {bad_value} outside the file's {nchunks}")
    finally:
        PyBuffer_Release(&view)
        if offs != offs_small:
            PyMem_Free(offs)
        header.index_count = count
        header.begin_timestamp = begin_ts
        header.begin_phy_offset = begin_phy
        header.end_timestamp = end_ts
        header.end_phy_offset = end_phy
        f._reserved_end = reserved_end
    if msg >= n:
        hpos = p
    return msg, hpos, err


def _self_check() -> None:
    """The C hash against the blake3 package around every block boundary of a chunk."""
    cdef bytes data = bytes(range(256)) * 5
    for length in (0, 1, 3, 31, 32, 63, 64, 65, 127, 128, 129, 500, 1023, 1024):
        sample = data[:length]
        if bytes_hash(sample) != int.from_bytes(_package_blake3(sample).digest(4), "big") & INT_MAX:
            raise ImportError(f"the compiled index hash disagrees with the blake3 package ({length} bytes)")


_self_check()
