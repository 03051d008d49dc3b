# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The duplicate window's key table, compiled (issue 37): 64-bit key hashes to objects.

Open addressing with linear probing in two flat arrays (hash, object): one probe per key in
memory the size of the window, no Python object per key, deletion by backward shift (no
tombstones, so a window that turns over at a steady size never rehashes).  Hash 0 marks an empty
slot (a key hashing to 0 is stored as 1).  :mod:`tidemq.broker.dedup_table` holds the Python
reference with the same API and picks this one when it is built.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset


cdef inline uint64_t _slot_hash(int64_t h) noexcept:
    cdef uint64_t u = <uint64_t>h
    return u if u != 0 else 1


cdef class HashTable:
    """64-bit key hash -> object (the :class:`~tidemq.broker.dedup.Sent` that stored the key)."""

    cdef uint64_t* _hashes
    cdef PyObject** _values
    cdef Py_ssize_t _mask
    cdef Py_ssize_t _used

    def __cinit__(self, Py_ssize_t capacity=64):
        cdef Py_ssize_t cap = 16
        while cap < capacity * 2:
            cap <<= 1
        self._hashes = NULL
        self._values = NULL
        self._alloc(cap)

    cdef int _alloc(self, Py_ssize_t cap) except -1:
        self._hashes = <uint64_t*>PyMem_Malloc(cap * sizeof(uint64_t))
        self._values = <PyObject**>PyMem_Malloc(cap * sizeof(PyObject*))
        if self._hashes == NULL or self._values == NULL:
            PyMem_Free(self._hashes)
            PyMem_Free(self._values)
            self._hashes = NULL
            self._values = NULL
            raise MemoryError()
        memset(self._hashes, 0, cap * sizeof(uint64_t))
        memset(self._values, 0, cap * sizeof(PyObject*))
        self._mask = cap - 1
        self._used = 0
        return 0

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._hashes != NULL:
            for i in range(self._mask + 1):
                if self._hashes[i] != 0:
                    Py_XDECREF(self._values[i])
        PyMem_Free(self._hashes)
        PyMem_Free(self._values)

    def __len__(self):
        return self._used

    @property
    def capacity(self):
        return self._mask + 1

    cdef Py_ssize_t _find(self, uint64_t h) noexcept:
        cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>self._mask)
        cdef uint64_t x
        while True:
            x = self._hashes[i]
            if x == 0:
                return -1
            if x == h:
                return i
            i = (i + 1) & self._mask

    cdef int _grow(self) except -1:
        cdef uint64_t* old_hashes = self._hashes
        cdef PyObject** old_values = self._values
        cdef Py_ssize_t old_cap = self._mask + 1
        cdef Py_ssize_t i, j
        cdef uint64_t h
        self._alloc(old_cap * 2)  # raises before anything moved: the old arrays stay whole
        for i in range(old_cap):
            h = old_hashes[i]
            if h != 0:
                j = <Py_ssize_t>(h & <uint64_t>self._mask)
                while self._hashes[j] != 0:
                    j = (j + 1) & self._mask
                self._hashes[j] = h
                self._values[j] = old_values[i]  # the reference moves
                self._used += 1
        PyMem_Free(old_hashes)
        PyMem_Free(old_values)
        return 0

    cdef object _put(self, uint64_t h, object value):
        """Store ``value`` under ``h``; the object it replaced, or None."""
        cdef Py_ssize_t i
        cdef PyObject* old
        if (self._used + 1) * 2 > self._mask + 1:
            self._grow()
        i = <Py_ssize_t>(h & <uint64_t>self._mask)
        while True:
            if self._hashes[i] == 0:
                Py_INCREF(value)
                self._hashes[i] = h
                self._values[i] = <PyObject*>value
                self._used += 1
                return None
            if self._hashes[i] == h:
                old = self._values[i]
                Py_INCREF(value)
                self._values[i] = <PyObject*>value
                result = <object>old  # a new reference for the caller...
                Py_XDECREF(old)  # ...and the table's dropped
                return result
            i = (i + 1) & self._mask

    cdef void _delete(self, Py_ssize_t i) noexcept:
        """Empty slot ``i`` (its reference already dropped) and shift back the run after it."""
        cdef Py_ssize_t j = i
        cdef Py_ssize_t k
        cdef Py_ssize_t mask = self._mask
        self._hashes[i] = 0
        self._values[i] = NULL
        self._used -= 1
        while True:
            j = (j + 1) & mask
            if self._hashes[j] == 0:
                return
            k = <Py_ssize_t>(self._hashes[j] & <uint64_t>mask)  # where the entry at j wants to be
            if (i <= j and (i < k <= j)) or (i > j and (k > i or k <= j)):
                continue  # reachable from its home without crossing i: it stays
            self._hashes[i] = self._hashes[j]
            self._values[i] = self._values[j]
            self._hashes[j] = 0
            self._values[j] = NULL
            i = j

    def get(self, int64_t h):
        """The object under ``h``, or None."""
        cdef Py_ssize_t i = self._find(_slot_hash(h))
        if i < 0:
            return None
        return <object>self._values[i]

    def put(self, int64_t h, object value):
        """Store ``value`` under ``h``; the object it replaced, or None."""
        return self._put(_slot_hash(h), value)

    def put_many(self, const int64_t[:] hashes, object value):
        """Store ``value`` under every hash; the replaced objects (None when none was)."""
        cdef Py_ssize_t n = hashes.shape[0]
        cdef Py_ssize_t i
        replaced = None
        for i in range(n):
            old = self._put(_slot_hash(hashes[i]), value)
            if old is not None:
                if replaced is None:
                    replaced = []
                replaced.append(old)
        return replaced

    def any_of(self, const int64_t[:] hashes):
        """Whether any of the hashes is in the table."""
        cdef Py_ssize_t n = hashes.shape[0]
        cdef Py_ssize_t i
        for i in range(n):
            if self._find(_slot_hash(hashes[i])) >= 0:
                return True
        return False

    def remove_many(self, const int64_t[:] hashes, object value):
        """Remove the hashes still stored with ``value`` (identity); how many were."""
        cdef Py_ssize_t n = hashes.shape[0]
        cdef Py_ssize_t i, at
        cdef Py_ssize_t removed = 0
        cdef PyObject* old
        for i in range(n):
            at = self._find(_slot_hash(hashes[i]))
            if at >= 0 and self._values[at] == <PyObject*>value:
                old = self._values[at]
                self._delete(at)
                Py_XDECREF(old)
                removed += 1
        return removed


from cpython.dict cimport PyDict_GetItem
from cpython.set cimport PySet_Add, PySet_GET_SIZE
from cpython.unicode cimport PyUnicode_GET_LENGTH


def batch_keys(list msgs, str name, Py_ssize_t max_length):
    """The batch's keys (property ``name`` of each message) and their hashes, as
    ``(keys, hashes, repeated)``: ``repeated`` is -1, or the index of the first message whose key
    an earlier one has.  None when a message has no usable key (absent, empty, longer than
    ``max_length``, not a str).  One C pass for what the send path did in four."""
    from array import array

    cdef Py_ssize_t n = len(msgs)
    cdef Py_ssize_t i
    cdef Py_ssize_t repeated = -1
    cdef PyObject* found
    keys = [None] * n
    hashes = array("q", bytes(8 * n))
    cdef int64_t[:] out = hashes
    seen = set()
    for i in range(n):
        props = (<object>msgs[i]).properties
        if type(props) is not dict:
            return None
        found = PyDict_GetItem(props, name)
        if found == NULL:
            return None
        key = <object>found
        if type(key) is not str:
            return None
        if PyUnicode_GET_LENGTH(key) == 0 or PyUnicode_GET_LENGTH(key) > max_length:
            return None
        keys[i] = key
        out[i] = hash(key)
        if repeated < 0:
            PySet_Add(seen, key)
            if PySet_GET_SIZE(seen) != i + 1:
                repeated = i
    return keys, hashes, repeated
