# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, auto_pickle=False, embedsignature=True
"""The send lane's prepare step, compiled (issue 38): SEND_MESSAGE, SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE requests of one read to the :class:`~tidemq.broker.services.put.Send` objects
:meth:`SendService.put` stores.

The Python reference is the send processor and ``SendService.prepare`` (header read, topic checks,
properties, the message, the send).  This module takes only what it can serve exactly as they do:
a request it cannot (another code, a V2 header with a name outside ``a``..``m``, a field that is
not a plain decimal string, a batch flag other than ``true``/``1``/``false``/``0``, a topic
``writable_queues`` does not vouch for, a queue id below zero or past the queue count, a transaction, delay or timer property, a
batch body the batch decoder refuses or finds empty, anything that raises) makes
:func:`prepare_sends` answer None for the whole run, and the Python handler serves it: the
answer, and the records stored, are the reference's by construction.  Nothing is changed before
that decision: no side effect on a refusal.
"""

from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyObject
from libc.stdint cimport int64_t

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object u)
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    void *PyUnicode_DATA(object u)
    PyObject *PyDict_GetItem(object d, object key)

cdef object _MessageInner = None
cdef object _Send = None
cdef object _decode_batch = None  # tidemq.message.decode_batch_messages: the twin the handler uses
cdef bint _bound = False

#: Properties whose send the Python handler rewrites (transaction half, delay level, timer).
_REWRITTEN = ("TRAN_MSG", "DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_OUT_MS")
cdef tuple REWRITTEN = _REWRITTEN
cdef str CLUSTER = "CLUSTER"
cdef str PROPERTY_SEPARATOR = "\x02"
cdef str NAME_VALUE_SEPARATOR = "\x01"
cdef int SEND_MESSAGE = 10
cdef int SEND_MESSAGE_V2 = 310
#: The send header's fields in the order the handler reads them (processors/send.py ``_FIELDS``):
#: batch, group, topic, queue id, sys flag, default topic, its queue count, properties,
#: reconsume times, max reconsume times, flag, born timestamp; V2's names, then the long ones.
cdef tuple SHORT = ("m", "a", "b", "e", "f", "c", "d", "i", "j", "l", "h", "g")
cdef tuple LONG = (
    "batch", "producerGroup", "topic", "queueId", "sysFlag", "defaultTopic", "defaultTopicQueueNums",
    "properties", "reconsumeTimes", "maxReconsumeTimes", "flag", "bornTimestamp",
)
cdef int SEND_BATCH_MESSAGE = 320
#: Timer properties: a batch with one is parked by the Python handler.
cdef tuple TIMERS = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
cdef int TRANSACTION_TYPE_MASK = 3 << 2

# Served and refused runs: read by tests and ``lane_counts``.
cdef Py_ssize_t _served = 0
cdef Py_ssize_t _refused = 0


cdef int _bind() except -1:
    global _MessageInner, _Send, _decode_batch, _bound
    from tidemq.broker.services.put import Send
    from tidemq.message import MessageInner, decode_batch_messages

    _MessageInner = MessageInner
    _Send = Send
    _decode_batch = decode_batch_messages
    _bound = True
    return 0


def lane_counts():
    """(runs served, runs refused to the Python handler) since import."""
    return _served, _refused


cdef inline int _field_int(object value, int64_t default, int64_t *out):
    """``field_int``'s reading of a plain decimal string (or absent/empty: ``default``); -1 when
    the value is anything else (the Python handler decides what it means)."""
    cdef Py_ssize_t n, i, start
    cdef const char *data
    cdef int64_t acc = 0
    cdef char c
    if value is None:
        out[0] = default
        return 0
    if type(value) is not str or not PyUnicode_IS_COMPACT_ASCII(value):
        return -1
    n = PyUnicode_GET_LENGTH(value)
    if n == 0:
        out[0] = default
        return 0
    data = <const char *>PyUnicode_DATA(value)
    start = 1 if data[0] == b'-' else 0
    if n - start < 1 or n - start > 18:
        return -1
    for i in range(start, n):
        c = data[i]
        if c < b'0' or c > b'9':
            return -1
        acc = acc * 10 + (c - 48)
    out[0] = -acc if start else acc
    return 0


cdef dict _properties(str text):
    """``string_to_properties``: pairs without a separator or a name are skipped, a later pair
    of one name overwrites the earlier one's value in its place."""
    cdef dict out = {}
    cdef str item, k, sep, v
    if not text:
        return out
    for item in text.split(PROPERTY_SEPARATOR):
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out[k] = v
    return out


cdef inline bint _has_timer(object props) except -1:
    """Whether a batch message's properties name a timer (``TIMERS``): one pass over its few
    names (a batch message has one or two) instead of a lookup per timer name."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef object k
    if not PyDict_CheckExact(props):
        for name in TIMERS:  # not the decoder's dict: ask it as the handler does
            if name in props:
                return True
        return False
    while PyDict_Next(props, &pos, &key, &value):
        k = <object>key
        if type(k) is not str:
            return True  # an odd key: the Python handler decides
        # "TIMER_DELAY_MS" is the shortest name
        if PyUnicode_GET_LENGTH(k) >= 14 and (<str>k)[0] == u'T' and k in TIMERS:
            return True
    return False


cdef inline bint _v2_names_only(dict fields):
    """Whether every header name is one of V2's ``a``..``m`` (as ``send_fields`` reads them as they are)."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef object k
    cdef Py_UCS4 ch
    while PyDict_Next(fields, &pos, &key, &value):
        k = <object>key
        if type(k) is not str or PyUnicode_GET_LENGTH(k) != 1:
            return False
        ch = (<str>k)[0]
        if ch < u'a' or ch > u'm':
            return False
    return True


def prepare_frames(
    list frames, writable_queues, str cluster, Py_ssize_t max_batch, tuple born_host, tuple store_host
):
    """:func:`prepare_sends` over the frames :func:`tidemq._native._frame_lane.take_frames` read
    (``frame[0]`` the code, ``frame[6]`` the header fields, ``frame[7]`` the body or None)."""
    global _served, _refused
    if not _bound:
        _bind()
    try:
        sends = _prepare(frames, True, writable_queues, cluster, max_batch, born_host, store_host)
    except Exception:  # whatever it is, the Python handler answers it
        sends = None
    if sends is None:
        _refused += 1
    else:
        _served += 1
    return sends


def prepare_sends(
    list requests, writable_queues, str cluster, Py_ssize_t max_batch, tuple born_host, tuple store_host
):
    """The sends of ``requests`` (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE, in order), or None when
    the lane does not take them.

    ``writable_queues(topic)`` is the broker's word on a topic: its queue count when a send to it
    needs no check beyond the queue id (known, writable, a valid name, no retry or system topic,
    no duplicate window), else -1.
    """
    global _served, _refused
    if not _bound:
        _bind()
    try:
        sends = _prepare(requests, False, writable_queues, cluster, max_batch, born_host, store_host)
    except Exception:  # whatever it is, the Python handler answers it
        sends = None
    if sends is None:
        _refused += 1
    else:
        _served += 1
    return sends


cdef inline object _payload(object request, bint framed):
    cdef object body
    if framed:
        body = (<tuple>request)[7]
        return b"" if body is None else body
    return request.payload()


cdef list _prepare(
    list requests, bint framed, writable_queues, str cluster, Py_ssize_t max_batch, tuple born_host, tuple store_host
):
    cdef list sends = []
    cdef object request, fields, batch, group, topic, text, body, msg, msgs, code
    cdef tuple keys
    cdef bint is_batch
    cdef int64_t queue_id, sys_flag, unused, reconsume, flag, born, count
    cdef object last_topic = None
    cdef int64_t last_count = -1
    cdef dict props
    cdef str name
    for request in requests:
        if framed:
            code = (<tuple>request)[0]
            fields = (<tuple>request)[6]
        else:
            code = request.code
            fields = request.ext_fields
        if code != SEND_MESSAGE_V2 and code != SEND_BATCH_MESSAGE and code != SEND_MESSAGE:
            return None
        if not PyDict_CheckExact(fields):
            return None
        # send_fields: V2's one-letter names (all of them, or the handler renames: not taken here),
        # else the long names as they are (other keys, such as an access key, are not read).
        if code == SEND_MESSAGE_V2 or (
            PyDict_GetItem(fields, "b") != NULL and PyDict_GetItem(fields, "topic") == NULL
        ):
            if not _v2_names_only(<dict>fields):
                return None
            keys = SHORT
        else:
            keys = LONG
        # the handler dispatches on the code or the header's batch flag (field_bool)
        batch = fields.get(keys[0])
        if batch is None or batch == "" or batch == "false" or batch == "0":
            is_batch = code == SEND_BATCH_MESSAGE
        elif batch == "true" or batch == "1":
            is_batch = True
        else:
            return None
        group = fields.get(keys[1], "")
        if type(group) is not str:
            return None
        topic = fields.get(keys[2])
        if type(topic) is not str:
            return None
        if topic is last_topic or topic == last_topic:
            count = last_count
        else:
            count = writable_queues(topic)
            last_topic, last_count = topic, count
        if count < 0:
            return None
        if _field_int(fields.get(keys[3]), -1, &queue_id) or queue_id < 0 or queue_id >= count:
            return None
        if _field_int(fields.get(keys[4]), 0, &sys_flag) or sys_flag & TRANSACTION_TYPE_MASK:
            return None
        if (
            _field_int(fields.get(keys[6]), 4, &unused)
            or _field_int(fields.get(keys[8]), 0, &reconsume)
            or _field_int(fields.get(keys[11]), 0, &born)
        ):
            return None
        if is_batch:
            # prepare_batch: the body's messages by the handler's own decoder (what it refuses, an
            # empty batch, or a timer on any message: the handler answers)
            body = _payload(request, framed)
            msgs = _decode_batch(
                body, max_batch, topic, queue_id, sys_flag, born, born_host, store_host, reconsume
            )
            if not msgs:
                return None
            for msg in msgs:
                if _has_timer(msg.properties):
                    return None
            sends.append(_Send(group, msgs, True, None, msgs[0].queue_id, len(body)))
            continue
        if _field_int(fields.get(keys[10]), 0, &flag):
            return None
        text = fields.get(keys[7])
        if text is None:
            text = ""
        elif type(text) is not str:
            return None
        props = _properties(<str>text)
        for name in REWRITTEN:
            if name in props:
                return None
        props[CLUSTER] = cluster
        body = _payload(request, framed)
        msg = _MessageInner(
            topic, body, queue_id, flag, props, sys_flag, born, born_host, store_host, reconsume
        )
        sends.append(_Send(group, [msg], False, None, queue_id, len(body)))
    return sends
