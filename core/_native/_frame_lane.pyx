# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The send lane's ends on the wire, compiled (issue 38): a read's leading send frames to what the
lane prepares (:func:`take_frames`), and the lane's settled sends to their response frames
(:func:`answer_frames`), without a :class:`~tidemq.remoting.command.RemotingCommand` per request.

The Python references are :class:`tidemq.remoting.codec.FrameDecoder` (frame split,
``decode_json_header``/``decode_binary_header``), ``send_response`` and
:func:`tidemq.remoting.codec.encode`.  :func:`take_frames` takes only frames the decoder reads
without a question: a whole frame within ``max_frame``, serialize type JSON or ROCKETMQ, a header
the decoder reads without a question (JSON through the same ``orjson.loads``; string ext values,
or other values made strings as the decoder makes them; an int32 opaque), code SEND_MESSAGE, SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE, flag 0 (a
plain request: no oneway, no response).  It stops at the first frame it does not take; the frames
from there on are the decoder's, which gives every malformed one its answer.  A frame is the tuple
``(code, language, version, opaque, flag, remark, ext_fields, body, serialize_type)``:
:func:`command_of` makes it the command the decoder would have made.

:func:`answer_frames` writes the frames ``encode(send_response(request, send))`` writes, byte for
byte, for sends whose status is SUCCESS or a stored one with no recall handle; for anything else
it answers None and the caller builds the responses in Python.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t
from libc.stdio cimport snprintf
from libc.string cimport memcmp, memcpy, strlen

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object u)
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    void *PyUnicode_DATA(object u)
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    object PyUnicode_DecodeASCII(const char *s, Py_ssize_t size, const char *errors)
    object PyUnicode_AsUTF8String(object u)
    PyObject *PyDict_GetItem(object d, object key)
    PyObject *PyList_GET_ITEM(object l, Py_ssize_t i)
    PyObject *PyDict_GetItemWithError(object d, object key) except? NULL
    dict _PyDict_NewPresized(Py_ssize_t minused)

cdef extern from *:
    """
    #include "structmember.h"
    /* A slot of a plain slotted class, by member offset (the Send's outcome fields). */
    static Py_ssize_t fl_member_offset(PyObject *descr) {
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    static inline PyObject *fl_get_slot(PyObject *obj, Py_ssize_t off) {
        return *(PyObject **)((char *)obj + off);
    }
    """
    Py_ssize_t fl_member_offset(PyObject *descr)
    PyObject *fl_get_slot(PyObject *obj, Py_ssize_t off)

cdef object _loads = None
cdef object _dumps = None
cdef object _Command = None
cdef object _JSON = None
cdef object _ROCKETMQ = None
cdef object _SUCCESS = None
cdef object _STORED = None
cdef dict _LANG_BY_BYTE = None
cdef bint _bound = False
#: ``Send``'s class, and the member offsets of the slots an answer reads (read directly when a
#: send is exactly that class and every slot is set; otherwise by attribute, as before).
cdef object _SendType = None
cdef Py_ssize_t _SEND_SLOTS[8]
cdef tuple _SEND_NAMES = ("status", "remark", "epoch", "recall_handle", "msgs", "msg_id", "queue_id", "queue_offset")

cdef int SEND_MESSAGE = 10
cdef int SEND_MESSAGE_V2 = 310
cdef int SEND_BATCH_MESSAGE = 320
cdef int MAX_HEADER = 0xFFFFFF
cdef int64_t INT32_MIN = -2147483648
cdef int64_t INT32_MAX = 2147483647
#: The responses' fixed fields (``RemotingCommand.reply_with``): language, version, flag.
cdef int RESPONSE_VERSION = 399
cdef int FLAG_RESPONSE = 1
cdef uint8_t PYTHON_BYTE = 3
cdef str CODE = "code"
cdef str OPAQUE = "opaque"
cdef str FLAG = "flag"
cdef str VERSION = "version"
cdef str LANGUAGE = "language"
cdef str REMARK = "remark"
cdef str EXT_FIELDS = "extFields"
cdef str JAVA = "JAVA"
cdef str OTHER = "OTHER"
cdef str MSG_REGION = "MSG_REGION"
cdef str TRACE_ON = "TRACE_ON"
cdef str DEFAULT_REGION = "DefaultRegion"
cdef str TRUE = "true"
cdef object ZERO = 0

# Frames taken, and reads whose answers were written here: read by tests.
cdef Py_ssize_t _taken = 0
cdef Py_ssize_t _answered = 0


cdef int _bind() except -1:
    global _loads, _dumps, _Command, _JSON, _ROCKETMQ, _SUCCESS, _STORED, _LANG_BY_BYTE, _bound, _ASCII1
    import orjson
    from tidemq.broker.services.put import STORED
    from tidemq.broker.services.status import Status
    from tidemq.remoting.codes import LanguageCode, SerializeType
    from tidemq.remoting.command import DEFAULT_VERSION, RemotingCommand

    if DEFAULT_VERSION != RESPONSE_VERSION or LanguageCode.PYTHON.value != PYTHON_BYTE:
        raise ImportError("tidemq._native._frame_lane is out of date with tidemq.remoting")
    _loads = orjson.loads
    _dumps = orjson.dumps
    _Command = RemotingCommand
    _JSON = SerializeType.JSON
    _ROCKETMQ = SerializeType.ROCKETMQ
    _SUCCESS = Status.SUCCESS
    _STORED = STORED
    _LANG_BY_BYTE = {lc.value: lc.name for lc in LanguageCode}
    _ASCII1 = tuple(chr(i) for i in range(128))
    _bind_send_slots()
    _bound = True
    return 0


cdef int _bind_send_slots() except -1:
    global _SendType
    from tidemq.broker.services.put import Send

    cdef Py_ssize_t i, off
    if type(Send) is not type or Send.__dictoffset__ != 0:
        return 0
    for i in range(8):
        descr = Send.__dict__.get(_SEND_NAMES[i])
        off = fl_member_offset(<PyObject *>descr)
        if off < 0:
            return 0
        _SEND_SLOTS[i] = off
    _SendType = Send
    return 0


def frame_counts():
    """(frames taken, reads answered here) since import."""
    return _taken, _answered


cdef inline uint32_t _u32(const unsigned char *p) nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int32_t _i32(const unsigned char *p) nogil:
    return <int32_t>_u32(p)


cdef inline int16_t _i16(const unsigned char *p) nogil:
    return <int16_t>((<uint32_t>p[0] << 8) | <uint32_t>p[1])


cdef inline bint _is_send(object code):
    return code == SEND_MESSAGE_V2 or code == SEND_MESSAGE or code == SEND_BATCH_MESSAGE


# ------------------------------------------------------------------ the header's JSON, read here
# The JSON headers clients write (the official client's, orjson's: no whitespace, the seven
# fields of a command, string ``extFields``) are read here without orjson's dict of the header;
# anything else the reader meets (whitespace, null, floats, escapes beyond ASCII, a repeated or an
# unknown name, bytes orjson might judge otherwise) returns None and ``_json_frame`` (orjson, the
# reference) decides.  So what is read here is what orjson would read, or nothing.
cdef tuple _ASCII1 = None  # the 128 one-character ASCII strings (V2's extFields names: "a".."m")
#: Per one-character name, the last plain ASCII value read for it (up to _REPEAT_MAX bytes).
cdef list _last_values = [None] * 128
#: The ext fields' dict is made for this many names (V2's twelve, a signed request's four more).
cdef Py_ssize_t _EXT_SIZE = 16
cdef Py_ssize_t _REPEAT_MAX = 64

cdef enum:
    K_CODE = 1
    K_LANGUAGE = 2
    K_VERSION = 4
    K_OPAQUE = 8
    K_FLAG = 16
    K_REMARK = 32
    K_EXT = 64


cdef inline bint _digit(unsigned char c) nogil:
    return 48 <= c <= 57


cdef inline int _hex(unsigned char c) nogil:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


cdef object _jint(const unsigned char *h, Py_ssize_t *at, Py_ssize_t n):
    """The JSON integer at ``h[at[0]]``, ``at[0]`` moved past it; None: not read here."""
    cdef Py_ssize_t i = at[0], start
    cdef bint neg = False
    cdef int64_t v = 0
    if i < n and h[i] == 45:  # '-'
        neg = True
        i += 1
    start = i
    if i >= n or not _digit(h[i]):
        return None
    if h[i] == 48 and i + 1 < n and _digit(h[i + 1]):
        return None  # a leading zero: not JSON
    while i < n and _digit(h[i]):
        if i - start >= 18:
            return None
        v = v * 10 + (h[i] - 48)
        i += 1
    if i < n and (h[i] == 46 or h[i] == 101 or h[i] == 69):  # '.', 'e', 'E': a float
        return None
    at[0] = i
    return -v if neg else v


cdef object _jstr(const unsigned char *h, Py_ssize_t *at, Py_ssize_t n):
    """The JSON string whose opening quote is at ``h[at[0] - 1]``, ``at[0]`` moved past its closing
    quote; None: not read here."""
    cdef Py_ssize_t i = at[0], start = at[0], k, j, p
    cdef unsigned char c
    cdef bint ascii = True, esc = False
    cdef int u, d
    cdef unsigned char *buf
    cdef object out
    while True:
        if i >= n:
            return None
        c = h[i]
        if c == 34:  # '"'
            break
        if c == 92:  # '\\'
            esc = True
            i += 6 if i + 1 < n and h[i + 1] == 117 else 2
            continue
        if c < 0x20:
            return None
        if c >= 0x80:
            ascii = False
        i += 1
    at[0] = i + 1
    k = i - start
    if not esc:
        if ascii:
            if k == 1:
                return _ASCII1[h[start]]
            return PyUnicode_DecodeASCII(<const char *>h + start, k, NULL)
        try:
            return PyUnicode_DecodeUTF8(<const char *>h + start, k, NULL)
        except UnicodeDecodeError:
            return None
    buf = <unsigned char *>PyMem_Malloc(k + 1)
    if buf == NULL:
        raise MemoryError()
    try:
        j = 0
        p = start
        while p < i:
            c = h[p]
            if c != 92:
                buf[j] = c
                j += 1
                p += 1
                continue
            c = h[p + 1]  # p + 1 < i: the scan above skipped two or six bytes from here
            if c == 34 or c == 92 or c == 47:
                buf[j] = c
            elif c == 98:
                buf[j] = 8
            elif c == 102:
                buf[j] = 12
            elif c == 110:
                buf[j] = 10
            elif c == 114:
                buf[j] = 13
            elif c == 116:
                buf[j] = 9
            elif c == 117:
                if p + 5 >= i:
                    return None
                u = 0
                for d in range(4):
                    if _hex(h[p + 2 + d]) < 0:
                        return None
                    u = u * 16 + _hex(h[p + 2 + d])
                if u >= 0x80:
                    return None  # beyond ASCII (surrogates and all): orjson's
                buf[j] = <unsigned char>u
                p += 4
            else:
                return None
            j += 1
            p += 2
        if ascii:
            return PyUnicode_DecodeASCII(<const char *>buf, j, NULL)
        try:
            out = PyUnicode_DecodeUTF8(<const char *>buf, j, NULL)
        except UnicodeDecodeError:
            return None
        return out
    finally:
        PyMem_Free(buf)


cdef object _jstr_repeated(const unsigned char *h, Py_ssize_t *at, Py_ssize_t n, unsigned char name):
    """:func:`_jstr` for the value of a one-character name: a short plain ASCII value equal to the
    last one read for that name is that same string object (a client repeats its producer group,
    topic, flags...: no new string per frame); anything else is :func:`_jstr`'s."""
    cdef Py_ssize_t i = at[0], start = at[0], k
    cdef unsigned char c
    cdef object last, value
    while True:
        if i >= n:
            return None
        c = h[i]
        if c == 34:
            break
        if c == 92 or c < 0x20 or c >= 0x80 or i - start >= _REPEAT_MAX:
            return _jstr(h, at, n)
        i += 1
    k = i - start
    last = <object>PyList_GET_ITEM(_last_values, name)
    if (
        last is not None
        and PyUnicode_GET_LENGTH(last) == k
        and memcmp(PyUnicode_DATA(last), h + start, k) == 0
    ):
        at[0] = i + 1
        return last
    value = _jstr(h, at, n)
    if value is not None:
        _last_values[name] = value
    return value


cdef int _name(const unsigned char *h, Py_ssize_t *at, Py_ssize_t n):
    """Which of the command's fields the name whose opening quote is at ``h[at[0] - 1]`` is, its
    closing quote and the colon after it passed; 0: not read here."""
    cdef Py_ssize_t i = at[0], k
    cdef const char *s
    cdef int which = 0
    while True:
        if i >= n or h[i] == 92 or h[i] < 0x20:
            return 0
        if h[i] == 34:
            break
        i += 1
    k = i - at[0]
    s = <const char *>h + at[0]
    if k == 4 and memcmp(s, b"code", 4) == 0:
        which = K_CODE
    elif k == 4 and memcmp(s, b"flag", 4) == 0:
        which = K_FLAG
    elif k == 6 and memcmp(s, b"opaque", 6) == 0:
        which = K_OPAQUE
    elif k == 6 and memcmp(s, b"remark", 6) == 0:
        which = K_REMARK
    elif k == 7 and memcmp(s, b"version", 7) == 0:
        which = K_VERSION
    elif k == 8 and memcmp(s, b"language", 8) == 0:
        which = K_LANGUAGE
    elif k == 9 and memcmp(s, b"extFields", 9) == 0:
        which = K_EXT
    else:
        return 0
    if i + 1 >= n or h[i + 1] != 58:  # ':'
        return 0
    at[0] = i + 2
    return which


cdef dict _jext(const unsigned char *h, Py_ssize_t *at, Py_ssize_t n):
    """The ``extFields`` object at ``h[at[0]]`` (its names and values strings), ``at[0]`` moved
    past it; None: not read here."""
    cdef Py_ssize_t pos = at[0]
    # Sized for V2's twelve names at once: no resize (two of them, each a new table) per header.
    cdef dict ext = _PyDict_NewPresized(_EXT_SIZE)
    cdef object key, value
    if pos >= n or h[pos] != 123:  # '{'
        return None
    pos += 1
    if pos < n and h[pos] == 125:  # '}'
        at[0] = pos + 1
        return ext
    cdef unsigned char c
    while True:
        if pos >= n or h[pos] != 34:
            return None
        pos += 1
        c = h[pos] if pos + 1 < n else 0
        if 0x20 <= c < 0x80 and c != 34 and c != 92 and h[pos + 1] == 34:
            key = _ASCII1[c]  # a one-character name (V2's): its value may repeat the last one's
            pos += 2
            if pos + 1 >= n or h[pos] != 58 or h[pos + 1] != 34:
                return None
            pos += 2
            value = _jstr_repeated(h, &pos, n, c)
        else:
            key = _jstr(h, &pos, n)
            if key is None or pos + 1 >= n or h[pos] != 58 or h[pos + 1] != 34:
                return None
            pos += 2
            value = _jstr(h, &pos, n)
        if value is None:
            return None
        PyDict_SetItem(ext, key, value)
        if pos >= n:
            return None
        if h[pos] == 44:  # ','
            pos += 1
            continue
        if h[pos] == 125:
            at[0] = pos + 1
            return ext
        return None


cdef tuple _fast_json(const unsigned char *h, Py_ssize_t n, object body):
    """``_json_frame``'s answer read without orjson's dict, or None (``_json_frame`` decides then)."""
    cdef Py_ssize_t pos = 1, count = 0
    cdef int seen = 0, which
    cdef object code = None, opaque = ZERO, flag = ZERO, version = ZERO, language = JAVA
    cdef object remark = None, value
    cdef dict ext = None
    if n < 2 or h[0] != 123:
        return None
    while True:
        if pos >= n or h[pos] != 34:
            return None
        pos += 1
        which = _name(h, &pos, n)
        if which == 0 or seen & which:
            return None  # a name not read here, or repeated
        seen |= which
        if which == K_EXT:
            ext = _jext(h, &pos, n)
            if ext is None:
                return None
        elif which == K_LANGUAGE or which == K_REMARK:
            if pos >= n or h[pos] != 34:
                return None
            pos += 1
            value = _jstr(h, &pos, n)
            if value is None:
                return None
            if which == K_LANGUAGE:
                language = value
            else:
                remark = value
        else:
            value = _jint(h, &pos, n)
            if value is None:
                return None
            if which == K_CODE:
                code = value
            elif which == K_OPAQUE:
                opaque = value
            elif which == K_FLAG:
                flag = value
            else:
                version = value
        if pos >= n:
            return None
        if h[pos] == 44:
            pos += 1
            continue
        if h[pos] == 125 and pos + 1 == n:
            break
        return None
    if code is None or ext is None:
        return None
    if not _is_send(code) or flag != 0 or opaque < INT32_MIN or opaque > INT32_MAX:
        return None
    return (code, language, version, opaque, flag, remark, ext, body, _JSON)


def fast_header(bytes header):
    """The frame tuple (no body) the header's own reader makes of a JSON header, or None where it
    leaves the header to orjson: for the differential tests and the fuzzer."""
    if not _bound:
        _bind()
    return _fast_json(<const unsigned char *>PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header), None)


def orjson_header(bytes header):
    """The frame tuple (no body) orjson's path (the reference) makes of a JSON header, or None."""
    if not _bound:
        _bind()
    return _json_frame(header, None)


cdef inline object _get(dict d, object key, object default):
    """``d.get(key, default)`` as a C call (an error raised by a key's comparison propagates)."""
    cdef PyObject *v = PyDict_GetItemWithError(d, key)
    return default if v == NULL else <object>v


cdef tuple _json_frame(bytes header, object body):
    """``decode_json_header``'s fast path, or None where it would not take it (or the lane would not)."""
    cdef object obj, code, opaque, flag, version, language, remark, ext
    cdef dict head
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    try:
        obj = _loads(header)
    except Exception:
        return None
    if not PyDict_CheckExact(obj):
        return None
    head = <dict>obj  # the lookups below are C calls, not ``dict.get`` method calls
    code = _get(head, CODE, None)
    opaque = _get(head, OPAQUE, ZERO)
    flag = _get(head, FLAG, ZERO)
    version = _get(head, VERSION, ZERO)
    language = _get(head, LANGUAGE, JAVA)
    remark = _get(head, REMARK, None)
    ext = _get(head, EXT_FIELDS, None)
    if (
        type(code) is not int
        or type(opaque) is not int
        or type(flag) is not int
        or type(version) is not int
        or type(language) is not str
        or (remark is not None and type(remark) is not str)
        or not PyDict_CheckExact(ext)
    ):
        return None
    while PyDict_Next(ext, &pos, &key, &value):
        if type(<object>value) is not str:
            ext = _ext_strings(<dict>ext)
            if ext is None:
                return None
            break
    if not _is_send(code) or flag != 0 or opaque < INT32_MIN or opaque > INT32_MAX:
        return None
    return (code, language, version, opaque, flag, remark, ext, body, _JSON)


cdef dict _ext_strings(dict ext):
    """The ext fields of a header with values other than strings, as the decoder makes them: each
    value as RocketMQ writes it (``stringify``; an object or array as its JSON), a null dropped;
    None where the decoder raises (a value nested too deeply to write again).
    rocketmq-client-cpp writes numbers there when it signs a request (``"queueId":0``)."""
    cdef dict out = {}
    for k, v in ext.items():
        if v is None:
            continue
        if type(v) is str:
            out[k] = v
        elif v is True:
            out[k] = TRUE
        elif v is False:
            out[k] = "false"
        elif isinstance(v, (dict, list)):
            try:
                out[k] = _dumps(v).decode()
            except Exception:
                return None
        else:
            out[k] = str(v)
    return out


cdef tuple _binary_frame(const unsigned char *h, Py_ssize_t n, object body):
    """``decode_binary_header``, or None where it raises (or the lane would not take the frame)."""
    cdef int16_t code, version, klen
    cdef uint8_t lang
    cdef int32_t opaque, flag, rlen, elen, vlen
    cdef Py_ssize_t pos, end
    cdef object remark = None, key, val, language
    cdef dict ext = {}
    if n < 21:
        return None
    code = _i16(h)
    lang = h[2]
    version = _i16(h + 3)
    opaque = _i32(h + 5)
    flag = _i32(h + 9)
    if flag != 0 or not _is_send(code):
        return None
    pos = 13
    rlen = _i32(h + pos)
    pos += 4
    if rlen < 0 or pos + rlen + 4 > n:
        return None
    try:
        if rlen:
            remark = PyUnicode_DecodeUTF8(<const char *>h + pos, rlen, NULL)
        pos += rlen
        elen = _i32(h + pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            return None
        end = pos + elen
        while pos < end:
            if pos + 2 > end:
                return None
            klen = _i16(h + pos)
            pos += 2
            if klen < 0 or pos + klen + 4 > end:
                return None
            key = PyUnicode_DecodeUTF8(<const char *>h + pos, klen, NULL)
            pos += klen
            vlen = _i32(h + pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                return None
            val = PyUnicode_DecodeUTF8(<const char *>h + pos, vlen, NULL)
            pos += vlen
            PyDict_SetItem(ext, key, val)
    except UnicodeDecodeError:
        return None
    language = _LANG_BY_BYTE.get(lang, OTHER)
    return (code, language, version, opaque, flag, remark, ext, body, _ROCKETMQ)


def take_frames(bytes data, Py_ssize_t max_frame):
    """The whole send frames at the start of ``data`` the lane takes, and where they end:
    ``(frames, end)``; no frames when the first is not one (the decoder's then)."""
    global _taken
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = 0, end, hstart, hend
    cdef uint32_t total, info, stype, hlen
    cdef list frames = []
    cdef tuple frame
    cdef object body
    if not _bound:
        _bind()
    while n - pos >= 8:
        total = _u32(p + pos)
        if total > <uint32_t>max_frame or total < 4:
            break
        end = pos + 4 + <Py_ssize_t>total
        if end > n:
            break
        info = _u32(p + pos + 4)
        stype = info >> 24
        hlen = info & MAX_HEADER
        if stype > 1 or hlen > total - 4:
            break
        hstart = pos + 8
        hend = hstart + <Py_ssize_t>hlen
        body = PyBytes_FromStringAndSize(<const char *>p + hend, end - hend) if hend < end else None
        if stype == 0:
            frame = _fast_json(p + hstart, hlen, body)
            if frame is None:
                frame = _json_frame(PyBytes_FromStringAndSize(<const char *>p + hstart, hlen), body)
        else:
            frame = _binary_frame(p + hstart, hlen, body)
        if frame is None:
            break
        frames.append(frame)
        pos = end
    _taken += len(frames)
    return frames, pos


def command_of(tuple frame):
    """The command the decoder makes of ``frame``."""
    if not _bound:
        _bind()
    return _Command(
        frame[0], frame[1], frame[2], frame[3], frame[4], frame[5], frame[6], frame[7], (), frame[8]
    )


# --------------------------------------------------------------------------- response frames
cdef struct Buf:
    char *p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _grow(Buf *b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef char *q
    if b.n + extra <= b.cap:
        return 0
    cap = b.cap * 2
    if cap < b.n + extra:
        cap = b.n + extra + 256
    q = <char *>PyMem_Realloc(b.p, cap)
    if q == NULL:
        raise MemoryError()
    b.p = q
    b.cap = cap
    return 0


cdef inline int _put(Buf *b, const char *s, Py_ssize_t k) except -1:
    _grow(b, k)
    memcpy(b.p + b.n, s, k)
    b.n += k
    return 0


cdef inline int _puts(Buf *b, const char *s) except -1:
    return _put(b, s, <Py_ssize_t>strlen(s))


cdef inline int _put_u32(Buf *b, uint32_t v) except -1:
    cdef unsigned char q[4]
    q[0] = (v >> 24) & 0xFF
    q[1] = (v >> 16) & 0xFF
    q[2] = (v >> 8) & 0xFF
    q[3] = v & 0xFF
    return _put(b, <const char *>q, 4)


cdef inline int _put_u16(Buf *b, unsigned int v) except -1:
    cdef unsigned char q[2]
    q[0] = (v >> 8) & 0xFF
    q[1] = v & 0xFF
    return _put(b, <const char *>q, 2)


cdef inline void _set_u32(Buf *b, Py_ssize_t at, uint32_t v):
    b.p[at] = <char>((v >> 24) & 0xFF)
    b.p[at + 1] = <char>((v >> 16) & 0xFF)
    b.p[at + 2] = <char>((v >> 8) & 0xFF)
    b.p[at + 3] = <char>(v & 0xFF)


cdef int _put_int(Buf *b, int64_t v) except -1:
    cdef char q[24]
    cdef int k = snprintf(q, 24, "%lld", <long long>v)
    return _put(b, q, k)


cdef int _put_json_str(Buf *b, str s) except -1:
    """``s`` as orjson writes a string: as it is when plain ASCII, else orjson's own bytes."""
    cdef Py_ssize_t k, i
    cdef const unsigned char *d
    cdef bytes text
    if PyUnicode_IS_COMPACT_ASCII(s):
        k = PyUnicode_GET_LENGTH(s)
        d = <const unsigned char *>PyUnicode_DATA(s)
        for i in range(k):
            if d[i] < 0x20 or d[i] == 34 or d[i] == 92:
                break
        else:
            _puts(b, '"')
            _put(b, <const char *>d, k)
            return _puts(b, '"')
    text = _dumps(s)
    return _put(b, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))


cdef int _put_json_field(Buf *b, const char *name, str value, bint first) except -1:
    if not first:
        _puts(b, ",")
    _puts(b, name)
    return _put_json_str(b, value)


cdef int _put_utf8(Buf *b, str s, bint short_len) except -1:
    cdef bytes raw = PyUnicode_AsUTF8String(s)
    cdef Py_ssize_t k = PyBytes_GET_SIZE(raw)
    if short_len:
        if k > 32767:
            raise OverflowError("key too long")
        _put_u16(b, <unsigned int>k)
    else:
        _put_u32(b, <uint32_t>k)
    return _put(b, PyBytes_AS_STRING(raw), k)


cdef int _answer(Buf *b, tuple frame, object send) except -1:
    """One response frame into ``b``; -2 (nothing written that counts) when not this lane's to write."""
    cdef object status, remark, epoch, recall, msgs, msg_id_obj, queue_id, queue_offset
    cdef PyObject *v[8]
    cdef Py_ssize_t i
    cdef dict properties
    cdef str region, trace, msg_id, epoch_text = None
    cdef Py_ssize_t start, hstart, ext_at
    cdef int64_t code, opaque = frame[3]
    cdef bint direct = type(send) is _SendType
    if direct:
        for i in range(8):
            v[i] = fl_get_slot(<PyObject *>send, _SEND_SLOTS[i])
            if v[i] == NULL:  # a slot not set: read by attribute below (its error, in its order)
                direct = False
                break
    if direct:
        status, remark, epoch, recall = <object>v[0], <object>v[1], <object>v[2], <object>v[3]
        msgs, msg_id_obj, queue_id, queue_offset = <object>v[4], <object>v[5], <object>v[6], <object>v[7]
        if status is not _SUCCESS and status not in _STORED:
            return -2
        if recall is not None or (remark is not None and type(remark) is not str):
            return -2
    else:
        status, remark, epoch = send.status, send.remark, send.epoch
        if status is not _SUCCESS and status not in _STORED:
            return -2
        if send.recall_handle is not None or (remark is not None and type(remark) is not str):
            return -2
        msgs = send.msgs
    properties = msgs[0].properties
    region = properties.get(MSG_REGION, DEFAULT_REGION)
    trace = properties.get(TRACE_ON, TRUE)
    if not direct:
        msg_id_obj = send.msg_id
    if type(region) is not str or type(trace) is not str or type(msg_id_obj) is not str:
        return -2
    msg_id = msg_id_obj
    if not direct:
        queue_id, queue_offset = send.queue_id, send.queue_offset
    if epoch is not None:
        epoch_text = str(epoch)
    code = int(status)
    start = b.n
    _put(b, "\0\0\0\0\0\0\0\0", 8)
    hstart = b.n
    if frame[8] is _JSON:
        _puts(b, '{"code":')
        _put_int(b, code)
        _puts(b, ',"language":"PYTHON","version":399,"opaque":')
        _put_int(b, opaque)
        _puts(b, ',"flag":1')
        if remark is not None:
            _puts(b, ',"remark":')
            _put_json_str(b, remark)
        _puts(b, ',"extFields":{')
        _put_json_field(b, '"msgId":', msg_id, True)
        _puts(b, ',"queueId":"')
        _put_int(b, queue_id)
        _puts(b, '","queueOffset":"')
        _put_int(b, queue_offset)
        _puts(b, '"')
        _put_json_field(b, '"MSG_REGION":', region, False)
        _put_json_field(b, '"TRACE_ON":', trace, False)
        if epoch_text is not None:
            _put_json_field(b, '"epoch":', epoch_text, False)
        _puts(b, "}}")
    else:
        if code < -32768 or code > 32767:
            return -2
        _put_u16(b, <unsigned int>(<int16_t>code) & 0xFFFF)
        _put(b, <const char *>&PYTHON_BYTE, 1)
        _put_u16(b, RESPONSE_VERSION)
        _put_u32(b, <uint32_t><int32_t>opaque)
        _put_u32(b, FLAG_RESPONSE)
        if remark:
            _put_utf8(b, remark, False)
        else:
            _put_u32(b, 0)
        ext_at = b.n
        _put_u32(b, 0)
        _put_utf8(b, "msgId", True)
        _put_utf8(b, msg_id, False)
        _put_utf8(b, "queueId", True)
        _put_utf8(b, str(queue_id), False)
        _put_utf8(b, "queueOffset", True)
        _put_utf8(b, str(queue_offset), False)
        _put_utf8(b, MSG_REGION, True)
        _put_utf8(b, region, False)
        _put_utf8(b, TRACE_ON, True)
        _put_utf8(b, trace, False)
        if epoch_text is not None:
            _put_utf8(b, "epoch", True)
            _put_utf8(b, epoch_text, False)
        _set_u32(b, ext_at, <uint32_t>(b.n - ext_at - 4))
    _set_u32(b, start, <uint32_t>(4 + b.n - hstart))
    _set_u32(b, start + 4, (<uint32_t>(0 if frame[8] is _JSON else 1) << 24) | <uint32_t>(b.n - hstart))
    return 0


def answer_frames(list frames, list sends):
    """The response frames of ``frames``' settled ``sends``, in order, as one bytes object; None
    when one of them is not this lane's to write (the caller answers them with ``send_response``)."""
    global _answered
    cdef Buf b
    cdef Py_ssize_t i, count = len(frames)
    cdef object out = None
    if not _bound:
        _bind()
    if len(sends) != count:
        raise ValueError("one send per frame")
    b.cap = 160 * count + 64
    b.n = 0
    b.p = <char *>PyMem_Malloc(b.cap)
    if b.p == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            try:
                if _answer(&b, <tuple>frames[i], sends[i]) == -2:
                    return None
            except (OverflowError, UnicodeError, TypeError, ValueError):
                return None  # what encode() would refuse: the Python path answers it
        out = PyBytes_FromStringAndSize(b.p, b.n)
    finally:
        PyMem_Free(b.p)
    _answered += 1
    return out
