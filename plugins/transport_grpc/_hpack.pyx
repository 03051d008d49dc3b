# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""HPACK (RFC 7541) header block decoding, compiled: the native gRPC server's per-call cost.

The same answers as ``hpack.Decoder(...).decode(block, raw=True)`` (tests/fuzz/fuzz_hpack.py
compares them), with the static table and Huffman code taken from the ``hpack`` package at import
time; errors are ``hpack``'s exceptions.  Every read is bounds-checked against the block: the
block is untrusted bytes from a client.
"""

from collections import deque

from hpack.exceptions import HPACKDecodingError, InvalidTableIndexError, InvalidTableSizeError, OversizedHeaderListError
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

cdef tuple STATIC = tuple((bytes(n), bytes(v)) for n, v in HeaderTable.STATIC_TABLE)
cdef Py_ssize_t STATIC_LEN = len(STATIC)

# The Huffman code as a binary tree: node i's children at _tree[2*i] (bit 0) and _tree[2*i+1]
# (bit 1); 0 is "none" (the root is never a child), a negative value -(symbol+1) a leaf.
cdef enum:
    MAX_NODES = 520
cdef int32_t _tree[2 * MAX_NODES]
cdef int32_t _nodes = 1


cdef void _build() except *:
    global _nodes
    cdef int symbol, bit, length, node, branch, i
    cdef uint64_t code
    for i in range(2 * MAX_NODES):
        _tree[i] = 0
    for symbol in range(257):
        code = REQUEST_CODES[symbol]
        length = REQUEST_CODES_LENGTH[symbol]
        node = 0
        for bit in range(length - 1, -1, -1):
            branch = 2 * node + <int>((code >> bit) & 1)
            if bit == 0:
                _tree[branch] = -(symbol + 1)
            else:
                if _tree[branch] == 0:
                    if _nodes >= MAX_NODES:
                        raise RuntimeError("Huffman tree larger than expected")
                    _tree[branch] = _nodes
                    _nodes += 1
                elif _tree[branch] < 0:
                    raise RuntimeError("Huffman code is not prefix-free")
                node = _tree[branch]


_build()


cdef bytes _huffman(const uint8_t* data, Py_ssize_t length):
    """The decoded string; HPACKDecodingError on EOS, a missing code, or bad padding."""
    cdef bytearray out = bytearray(length * 8 // 5 + 1)
    cdef uint8_t* o = <uint8_t*>(<char*>out)
    cdef Py_ssize_t n = 0, i
    cdef int32_t node = 0, child
    cdef int bit, since = 0, ones = 1
    cdef uint8_t byte
    for i in range(length):
        byte = data[i]
        for bit in range(7, -1, -1):
            child = _tree[2 * node + ((byte >> bit) & 1)]
            if child == 0:
                raise HPACKDecodingError("invalid Huffman code")
            if child < 0:
                if child == -257:
                    raise HPACKDecodingError("EOS in a Huffman string")
                o[n] = <uint8_t>(-child - 1)
                n += 1
                node = 0
                since = 0
                ones = 1
            else:
                node = child
                since += 1
                if not ((byte >> bit) & 1):
                    ones = 0
    if since > 7 or not ones:
        raise HPACKDecodingError("invalid Huffman padding")
    return bytes(out[:n])


cdef class Decoder:
    """One connection's HPACK decoder (its dynamic table)."""

    cdef object table  # deque of (name, value), newest first
    cdef Py_ssize_t size
    cdef public Py_ssize_t max_size
    cdef public Py_ssize_t max_allowed_table_size
    cdef public Py_ssize_t max_header_list_size

    def __init__(self, Py_ssize_t max_header_list_size=65536, Py_ssize_t max_allowed_table_size=4096):
        self.table = deque()
        self.size = 0
        self.max_size = 4096
        self.max_allowed_table_size = max_allowed_table_size
        self.max_header_list_size = max_header_list_size

    cdef tuple _get(self, uint64_t index):
        if index == 0:
            raise InvalidTableIndexError("index 0")
        if index <= <uint64_t>STATIC_LEN:
            return <tuple>STATIC[index - 1]
        index -= STATIC_LEN + 1
        if index < <uint64_t>len(self.table):
            return <tuple>self.table[index]
        raise InvalidTableIndexError(f"index {index + STATIC_LEN + 1} beyond the table")

    cdef void _evict(self) except *:
        cdef tuple entry
        while self.size > self.max_size and self.table:
            entry = self.table.pop()
            self.size -= len(<bytes>entry[0]) + len(<bytes>entry[1]) + 32

    cdef void _add(self, bytes name, bytes value) except *:
        cdef Py_ssize_t size = len(name) + len(value) + 32
        if size > self.max_size:
            self.table.clear()
            self.size = 0
            return
        self.size += size
        self.table.appendleft((name, value))
        self._evict()

    def decode(self, bytes block, raw=True):
        """The header fields of ``block`` as (name, value) bytes pairs."""
        cdef const uint8_t* data = <const uint8_t*>PyBytes_AS_STRING(block)
        cdef Py_ssize_t end = len(block), pos = 0, total = 0, length
        cdef uint64_t value
        cdef uint8_t first
        cdef int prefix, shift, huffman, kind
        cdef bytes name, text
        cdef tuple entry
        cdef list headers = []
        while pos < end:
            first = data[pos]
            if first & 0x80:
                kind, prefix = 0, 7  # indexed
            elif first & 0xC0 == 0x40:
                kind, prefix = 1, 6  # literal, incremental indexing
            elif first & 0xE0 == 0x20:
                kind, prefix = 2, 5  # table size update
            else:
                kind, prefix = 3, 4  # literal, without indexing / never indexed
            # the integer of the first byte's prefix
            value = first & ((1 << prefix) - 1)
            pos += 1
            if value == <uint64_t>((1 << prefix) - 1):
                shift = 0
                while True:
                    if pos >= end:
                        raise HPACKDecodingError("integer cut short")
                    if shift > 28:
                        raise HPACKDecodingError("integer too large")
                    value += <uint64_t>(data[pos] & 0x7F) << shift
                    shift += 7
                    pos += 1
                    if not data[pos - 1] & 0x80:
                        break
            if kind == 0:
                entry = self._get(value)
                headers.append(entry)
                total += len(<bytes>entry[0]) + len(<bytes>entry[1]) + 32
            elif kind == 2:
                if headers:  # RFC 7541 4.2: only at the start of a block
                    raise HPACKDecodingError("table size update after a header field")
                if value > <uint64_t>self.max_allowed_table_size:
                    raise InvalidTableSizeError(f"table size {value} above {self.max_allowed_table_size}")
                self.max_size = <Py_ssize_t>value
                self._evict()
                continue
            else:
                if value:
                    name = <bytes>self._get(value)[0]
                else:
                    name = self._string(data, &pos, end)
                text = self._string(data, &pos, end)
                if kind == 1:
                    self._add(name, text)
                headers.append((name, text))
                total += len(name) + len(text) + 32
            if total > self.max_header_list_size:
                raise OversizedHeaderListError(f"header list larger than {self.max_header_list_size}")
        return headers

    cdef bytes _string(self, const uint8_t* data, Py_ssize_t* at, Py_ssize_t end):
        cdef Py_ssize_t pos = at[0]
        cdef uint64_t length
        cdef int shift, huffman
        if pos >= end:
            raise HPACKDecodingError("string cut short")
        huffman = data[pos] & 0x80
        length = data[pos] & 0x7F
        pos += 1
        if length == 0x7F:
            shift = 0
            while True:
                if pos >= end:
                    raise HPACKDecodingError("integer cut short")
                if shift > 28:
                    raise HPACKDecodingError("integer too large")
                length += <uint64_t>(data[pos] & 0x7F) << shift
                shift += 7
                pos += 1
                if not data[pos - 1] & 0x80:
                    break
        if length > <uint64_t>(end - pos):
            raise HPACKDecodingError("string longer than the block")
        at[0] = pos + <Py_ssize_t>length
        if huffman:
            return _huffman(data + pos, <Py_ssize_t>length)
        return PyBytes_FromStringAndSize(<const char*>(data + pos), <Py_ssize_t>length)
