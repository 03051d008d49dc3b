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

from cpython.pycapsule cimport PyCapsule_GetPointer

include "_support.pxi"
include "_fields.pxi"

cdef extern from "Python.h":
    PyObject *PyDict_GetItem(object d, object key)  # borrowed, NULL when absent

cdef object _Send = None
cdef object _decode_batch = None  # tidemq.message.decode_batch_messages: the twin the handler uses
cdef bint _lane_bound = False

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
#: A signed request's names besides V2's (tidemq.acl): the handler's send_fields passes them
#: through its renamed copy and never reads them, so a V2 header with them is still taken.
cdef frozenset ACL_NAMES = frozenset(("AccessKey", "Signature", "SecurityToken", "OnsChannel"))
#: Timer properties: a batch with one is parked by the Python handler.
cdef tuple TIMERS = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
cdef int TRANSACTION_TYPE_MASK = 3 << 2

# Served and refused runs: read by tests and ``lane_counts``.
cdef Py_ssize_t _served = 0
cdef Py_ssize_t _refused = 0


# A Send built without its Python ``__init__``: the slots that ``__init__`` fills, each from one
# of its arguments (producer_group, msgs, batch, ctx, queue_id, nbytes) or with a constant, found
# by probing the class once (``_send_recipe``); ``_send_n`` -1 when the class is not a plain
# slotted class whose ``__init__`` only stores its arguments and constants (then it is called).
cdef enum:
    SEND_MAX_SLOTS = 32
    SEND_ARGS = 6
cdef Py_ssize_t _send_n = -1
cdef Py_ssize_t _send_off[SEND_MAX_SLOTS]
cdef int _send_arg[SEND_MAX_SLOTS]            # the argument stored in the slot, or -1: a constant
cdef PyObject *_send_const[SEND_MAX_SLOTS]    # the constant (a strong reference), or NULL


cdef object _slot_names(cls):
    """Every slot of ``cls`` with its member offset, or None when ``cls`` is not a plain slotted
    class (no ``__dict__``, ``object.__new__``, every slot a writable object member)."""
    if type(cls) is not type or cls.__new__ is not object.__new__ or cls.__dictoffset__ != 0:
        return None
    slots = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        names = klass.__dict__.get("__slots__")
        if names is None:
            return None
        if isinstance(names, str):
            names = (names,)
        for name in names:
            descr = klass.__dict__.get(name)
            off = tq_member_offset(<PyObject *>descr)
            if off < 0:
                return None
            slots.append((name, off))
    return slots


cdef object _probe_send(cls, list slots):
    """Per slot, ("arg", i) or ("const", value) or ("unset",) from one call of ``cls``."""
    sentinels = tuple([object() for _ in range(SEND_ARGS)])
    probe = cls(*sentinels)
    recipe = []
    cdef PyObject *v
    for name, off in slots:
        v = tq_get_slot(<PyObject *>probe, off)
        if v == NULL:
            recipe.append(("unset",))
            continue
        value = <object>v
        for i in range(SEND_ARGS):
            if value is sentinels[i]:
                recipe.append(("arg", i))
                break
        else:
            if not (
                value is None or value is True or value is False
                or (type(value) is int and -5 <= value <= 256)  # CPython's shared small ints
            ):
                return None  # a fresh or computed object per send: only the class makes it
            recipe.append(("const", value))
    return recipe


cdef int _send_recipe(cls) except -1:
    """Fill ``_send_off``/``_send_arg``/``_send_const`` for ``cls``, or leave ``_send_n`` -1."""
    global _send_n
    cdef Py_ssize_t i
    slots = _slot_names(cls)
    if slots is None or len(slots) > SEND_MAX_SLOTS:
        return 0
    try:
        first = _probe_send(cls, slots)
        second = _probe_send(cls, slots)
    except Exception:
        return 0
    if first is None or first != second:
        return 0
    for i in range(len(slots)):
        if first[i][0] == "unset":
            _send_off[i] = -1
            continue
        _send_off[i] = slots[i][1]
        if first[i][0] == "arg":
            _send_arg[i] = first[i][1]
            _send_const[i] = NULL
        else:
            _send_arg[i] = -1
            Py_INCREF(first[i][1])
            _send_const[i] = <PyObject *>first[i][1]
    _send_n = len(slots)
    return 0


cdef object _new_send(object group, object msgs, object batch, object queue_id, Py_ssize_t nbytes):
    """``Send(group, msgs, batch, None, queue_id, nbytes)``."""
    cdef PyObject *args[SEND_ARGS]
    cdef Py_ssize_t i
    if _send_n < 0:
        return _Send(group, msgs, batch, None, queue_id, nbytes)
    size = PyLong_FromLongLong(nbytes)
    args[0] = <PyObject *>group
    args[1] = <PyObject *>msgs
    args[2] = <PyObject *>batch
    args[3] = <PyObject *>None
    args[4] = <PyObject *>queue_id
    args[5] = <PyObject *>size
    send = _new(_Send)
    for i in range(_send_n):
        if _send_off[i] < 0:
            continue
        if _send_arg[i] >= 0:
            tq_set_slot(<PyObject *>send, _send_off[i], args[_send_arg[i]])
        else:
            tq_set_slot(<PyObject *>send, _send_off[i], _send_const[i])
    return send


cdef object _new_message(
    topic, body, queue_id, flag, dict props, sys_flag, born, born_host, store_host, reconsume
):
    """``MessageInner(topic, body, queue_id, flag, props, sys_flag, born, born_host, store_host,
    reconsume)``: slot by slot when the class allows it (``_slot_offsets``: no validator,
    converter or hook, every field a slot), else by the class."""
    if _inner_off[0] < 0:
        return MessageInner(
            topic, body, queue_id, flag, props, sys_flag, born, born_host, store_host, reconsume
        )
    msg = _new(MessageInner)
    cdef PyObject *m = <PyObject *>msg
    tq_set_slot(m, _inner_off[0], <PyObject *>topic)
    tq_set_slot(m, _inner_off[1], <PyObject *>body)
    tq_set_slot(m, _inner_off[2], <PyObject *>queue_id)
    tq_set_slot(m, _inner_off[3], <PyObject *>flag)
    tq_set_slot(m, _inner_off[4], <PyObject *>props)
    tq_set_slot(m, _inner_off[5], <PyObject *>sys_flag)
    tq_set_slot(m, _inner_off[6], <PyObject *>born)
    tq_set_slot(m, _inner_off[7], <PyObject *>born_host)
    tq_set_slot(m, _inner_off[8], <PyObject *>store_host)
    tq_set_slot(m, _inner_off[9], <PyObject *>reconsume)
    tq_set_slot(m, _inner_off[10], <PyObject *>ZERO)
    return msg


cdef object ZERO = 0


cdef int _bind_lane() except -1:
    global _Send, _decode_batch, _lane_bound
    from tidemq.broker.services.put import Send
    from tidemq.message import decode_batch_messages

    if not _bound:
        _bind()  # MessageInner and its slots (_support.pxi)
    _Send = Send
    _send_recipe(Send)
    _decode_batch = decode_batch_messages
    _lane_bound = True
    return 0


def send_recipe(cls):
    """How a ``cls`` would be built without its ``__init__`` (for tests): per slot, its name and
    ("arg", i), ("const", value) or ("unset",); None when it is called instead."""
    slots = _slot_names(cls)
    if slots is None or len(slots) > SEND_MAX_SLOTS:
        return None
    first = _probe_send(cls, slots)
    if first is None or first != _probe_send(cls, slots):
        return None
    return [(name, how) for (name, _), how in zip(slots, first)]


def uses_direct_objects():
    """Whether sends and single-send messages are built slot by slot (for tests)."""
    if not _lane_bound:
        _bind_lane()
    return {"Send": _send_n >= 0, "MessageInner": _inner_off[0] >= 0}


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
    cdef dict out
    cdef str item, k, sep, v
    if PyUnicode_IS_COMPACT_ASCII(text):
        # Its characters are its bytes: split where they are, names from the key cache
        # (_fields.pxi's _parse_props, the batch decoder's reading of the same format).
        return <dict>_parse_props(<const uint8_t *>PyUnicode_DATA(text), 0, PyUnicode_GET_LENGTH(text))
    out = {}
    if not text:
        return out
    for item in text.split(PROPERTY_SEPARATOR):
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out[k] = v
    return out


cdef inline bint _rewritten(dict props) except -1:
    """Whether a name of ``REWRITTEN`` is among ``props``' (a dict of str names): one pass over
    its few names instead of a lookup per rewritten name."""
    cdef Py_ssize_t pos = 0, n
    cdef PyObject *key
    cdef PyObject *value
    cdef object k
    cdef Py_UCS4 first
    while PyDict_Next(props, &pos, &key, &value):
        k = <object>key
        n = PyUnicode_GET_LENGTH(k)
        # "DELAY" is the shortest name, "TIMER_DELIVER_MS" the longest
        if n < 5 or n > 16:
            continue
        first = (<str>k)[0]
        if (first == u'T' or first == u'D') and k in REWRITTEN:
            return True
    return False


cdef inline object _properties_of(msg):
    """``msg.properties``, read from its slot when it is a MessageInner built slot by slot."""
    cdef PyObject *p
    if _inner_off[0] >= 0 and Py_TYPE(msg) == <PyTypeObject *>MessageInner:
        p = tq_get_slot(<PyObject *>msg, _inner_off[4])
        if p != NULL:
            return <object>p
    return msg.properties


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


#: Per letter ``a``..``m`` of a V2 name, its place in ``SHORT`` (-1: ``k``, unitMode, not read).
cdef int SHORT_AT[13]
SHORT_AT[:] = [1, 2, 5, 6, 3, 4, 11, 10, 7, 8, -1, 9, 0]


cdef inline bint _v2_fields(dict fields, PyObject **vals):
    """Whether every header name is one of V2's ``a``..``m`` (as ``send_fields`` reads them as
    they are) or a signed request's (``ACL_NAMES``, which it never reads); ``vals`` then holds
    the V2 values in ``SHORT``'s order (NULL: absent), borrowed.  One pass over the header
    instead of a lookup per field."""
    cdef Py_ssize_t pos = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef object k
    cdef Py_UCS4 ch
    cdef int at
    memset(vals, 0, 12 * sizeof(PyObject *))
    while PyDict_Next(fields, &pos, &key, &value):
        k = <object>key
        if type(k) is not str:
            return False
        if PyUnicode_GET_LENGTH(k) != 1:
            if k in ACL_NAMES:
                continue
            return False
        ch = (<str>k)[0]
        if ch < u'a' or ch > u'm':
            return False
        at = SHORT_AT[<int>ch - 97]  # ch - 'a'
        if at >= 0:
            vals[at] = value
    return True


cdef inline object _val(PyObject *v):
    return <object>v if v != NULL else None


def prepare_frames(
    list frames, writable_queues, str cluster, Py_ssize_t max_batch, tuple born_host, tuple store_host
):
    """:func:`prepare_sends` over the frames :func:`tidemq._native._frame_lane.take_frames` read
    (``frame[0]`` the code, ``frame[6]`` the header fields, ``frame[7]`` the body or None)."""
    global _served, _refused
    if not _lane_bound:
        _bind_lane()
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
    if not _lane_bound:
        _bind_lane()
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
    cdef object request, batch, group, topic, text, body, msg, msgs, code, qid
    cdef dict fields
    cdef PyObject *vals[12]
    cdef Py_ssize_t i
    cdef long long c
    cdef int overflow = 0
    cdef int64_t last_born = 0
    cdef object last_born_obj = None
    cdef bint is_batch
    cdef int64_t queue_id, sys_flag, unused, reconsume, flag, born, count
    cdef object last_topic = None
    cdef int64_t last_count = -1
    cdef dict props
    for request in requests:
        if framed:
            code = (<tuple>request)[0]
            header = (<tuple>request)[6]
        else:
            code = request.code
            header = request.ext_fields
        # the code as a C integer (no int object made per comparison)
        if isinstance(code, int):
            c = raw_as_ll(code, &overflow)
            if overflow:
                return None
        elif code == SEND_MESSAGE_V2:
            c = SEND_MESSAGE_V2
        elif code == SEND_BATCH_MESSAGE:
            c = SEND_BATCH_MESSAGE
        elif code == SEND_MESSAGE:
            c = SEND_MESSAGE
        else:
            return None
        if c != SEND_MESSAGE_V2 and c != SEND_BATCH_MESSAGE and c != SEND_MESSAGE:
            return None
        if not PyDict_CheckExact(header):
            return None
        fields = <dict>header
        # send_fields: V2's one-letter names (all of them, or the handler renames: not taken here),
        # else the long names as they are (other keys, such as an access key, are not read).
        # ``vals``: the fields in the handler's order (``SHORT``/``LONG``), borrowed from the
        # header, read before any Python runs (``writable_queues``).
        if c == SEND_MESSAGE_V2 or (
            PyDict_GetItem(fields, "b") != NULL and PyDict_GetItem(fields, "topic") == NULL
        ):
            if not _v2_fields(fields, vals):
                return None
        else:
            for i in range(12):
                vals[i] = PyDict_GetItem(fields, <object>PyTuple_GET_ITEM(LONG, i))
        # the handler dispatches on the code or the header's batch flag (field_bool)
        batch = _val(vals[0])
        if batch is None or batch == "" or batch == "false" or batch == "0":
            is_batch = c == SEND_BATCH_MESSAGE
        elif batch == "true" or batch == "1":
            is_batch = True
        else:
            return None
        group = <object>vals[1] if vals[1] != NULL else ""
        if type(group) is not str:
            return None
        topic = _val(vals[2])
        if type(topic) is not str:
            return None
        if (
            _field_int(_val(vals[3]), -1, &queue_id)
            or _field_int(_val(vals[4]), 0, &sys_flag)
            or sys_flag & TRANSACTION_TYPE_MASK
            or _field_int(_val(vals[6]), 4, &unused)
            or _field_int(_val(vals[8]), 0, &reconsume)
            or _field_int(_val(vals[11]), 0, &born)
        ):
            return None
        if not is_batch:
            if _field_int(_val(vals[10]), 0, &flag):
                return None
            text = _val(vals[7])
            if text is None:
                text = ""
            elif type(text) is not str:
                return None
        if topic is last_topic or topic == last_topic:
            count = last_count
        else:
            count = writable_queues(topic)
            last_topic, last_count = topic, count
        if count < 0 or queue_id < 0 or queue_id >= count:
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
                if _has_timer(_properties_of(msg)):
                    return None
            sends.append(_new_send(group, msgs, True, msgs[0].queue_id, len(body)))
            continue
        props = _properties(<str>text)
        if _rewritten(props):
            return None
        props[CLUSTER] = cluster
        body = _payload(request, framed)
        qid = queue_id
        if born != last_born or last_born_obj is None:  # a read's sends share a few milliseconds
            last_born_obj = born
            last_born = born
        msg = _new_message(
            topic, body, qid, flag, props, sys_flag, last_born_obj, born_host, store_host, reconsume
        )
        sends.append(_new_send(group, [msg], False, qid, len(body)))
    return sends


# --------------------------------------------------------------------------- settlement (single)
# ``put.settled_many``'s per-send part compiled: per send of a read, what ``put._fill`` sets
# (status, remark, epoch, message id, queue offset; the window's ``Sent.stored``), read and written
# slot by slot.  The put's outcome (its futures, replicas, status mapping) stays Python, asked
# once per put through ``put_outcome``; a send with a hook context, a put the store refused and a
# duplicate go through the Python functions themselves (``fill``, ``Sent.settled``).

cdef bint _settle_bound = False
cdef bint _settle_direct = False
cdef Py_ssize_t _o_group, _o_ctx, _o_dedup, _o_index, _o_msgs
cdef Py_ssize_t _o_status, _o_remark, _o_msg_id, _o_queue_offset, _o_epoch
cdef object _TX_KINDS = None  # put._NOT_CONSUMABLE
cdef int _TX_MASK = 3 << 2
cdef object _UNASKED = object()
# The window's ``Sent.stored`` body in C (``_dedup_table.STORED_C``; NULL: not built, call it).
ctypedef int (*_stored_fn)(object, object, object, object, object, object) except -1
cdef _stored_fn _dedup_stored = NULL


cdef class _PutFill:
    """One put's outcome as its sends take it (cached per put for a read)."""
    cdef object outcome  # put._Outcome, or None: it waits
    cdef object code, remark, epoch, result, ids, joined, qoff
    cdef Py_ssize_t nsends
    cdef bint python, consumable, have_consumable


cdef int _bind_settle() except -1:
    global _settle_bound, _settle_direct, _TX_KINDS, _dedup_stored
    global _o_group, _o_ctx, _o_dedup, _o_index, _o_msgs
    global _o_status, _o_remark, _o_msg_id, _o_queue_offset, _o_epoch
    from tidemq.broker.services import put

    if not _lane_bound:
        _bind_lane()
    _TX_KINDS = put._NOT_CONSUMABLE
    from tidemq.broker import dedup_table

    cap = dedup_table.STORED_C
    if cap is not None:
        _dedup_stored = <_stored_fn>PyCapsule_GetPointer(cap, b"tidemq.broker._dedup_table.STORED_C")
    slots = _slot_names(_Send)
    _settle_bound = True
    if slots is None:
        return 0
    offs = dict(slots)
    try:
        _o_group, _o_ctx, _o_dedup = offs["group"], offs["ctx"], offs["dedup"]
        _o_index, _o_msgs = offs["index"], offs["msgs"]
        _o_status, _o_remark, _o_msg_id = offs["status"], offs["remark"], offs["msg_id"]
        _o_queue_offset, _o_epoch = offs["queue_offset"], offs["epoch"]
    except KeyError:
        return 0
    _settle_direct = True
    return 0


cdef _PutFill _put_fill(object broker, object group, object put_outcome):
    cdef _PutFill f = _PutFill.__new__(_PutFill)
    if _put_direct and put_outcome is _py_put_outcome:
        f.outcome = _put_outcome_c(broker, group)  # the same function, compiled
    else:
        f.outcome = put_outcome(broker, group)
    if f.outcome is None:
        return f
    f.result = group.result
    if f.result is None:  # the store raised: the Python fill (log text, forget the keys)
        f.python = True
        return f
    f.code, f.remark, f.epoch = f.outcome
    f.nsends = group.nsends
    f.ids = f.result.msg_ids
    f.qoff = f.result.queue_offset
    return f


cdef inline object _slot(object obj, Py_ssize_t off):
    cdef PyObject *v = tq_get_slot(<PyObject *>obj, off)
    if v == NULL:
        raise AttributeError(off)
    return <object>v


cdef int _fill_one(object send, object group, _PutFill f) except -1:
    """``put._fill`` of a send with no hook context whose put was stored (same fields, same order
    of effects: the send's outcome, then the window told)."""
    cdef Py_ssize_t index, count
    cdef object ids = f.ids, msg_id, queue_offset, dedup
    if f.nsends == 1:
        msg_id = ids[0] if len(ids) == 1 else _joined(f)
        queue_offset = f.qoff
    else:
        index = _slot(send, _o_index)
        count = len(_slot(send, _o_msgs))
        if index + count > len(ids):
            msg_id = _joined(f)
        else:
            msg_id = ids[index] if count == 1 else ",".join(ids[index:index + count])
        if not f.have_consumable:
            first = group.msgs[0]
            f.consumable = (first.sys_flag & _TX_MASK) not in _TX_KINDS
            f.have_consumable = True
        queue_offset = f.qoff + index if f.consumable else f.qoff
    tq_set_slot(<PyObject *>send, _o_epoch, <PyObject *>f.epoch)
    tq_set_slot(<PyObject *>send, _o_status, <PyObject *>f.code)
    tq_set_slot(<PyObject *>send, _o_remark, <PyObject *>f.remark)
    tq_set_slot(<PyObject *>send, _o_msg_id, <PyObject *>msg_id)
    tq_set_slot(<PyObject *>send, _o_queue_offset, <PyObject *>queue_offset)
    dedup = _slot(send, _o_dedup)
    if dedup is not None:
        if _dedup_stored == NULL or not _dedup_stored(dedup, send, f.result, f.code, msg_id, queue_offset):
            dedup.stored(send, f.result)
    return 0


cdef object _joined(_PutFill f):
    if f.joined is None:
        f.joined = f.result.msg_id
    return f.joined


def settle_sends(object broker, list sends, list done, object put_outcome, object fill):
    """``put.settled_many``'s loop when no topic waits to be written: each send whose ``done`` is
    False filled when its put answered, ``done`` set; ``put_outcome(broker, group)`` asked once
    per put, ``fill(broker, send, group, outcome)`` for what only the Python fill does."""
    cdef Py_ssize_t i, n = len(sends)
    cdef dict fills = {}
    cdef _PutFill f
    cdef PyObject *hit
    if not _put_bound:
        _bind_put()
    if len(done) != n:
        raise ValueError("one done flag per send")
    for i in range(n):
        if done[i]:
            continue
        send = sends[i]
        group = _slot(send, _o_group) if _settle_direct else send.group
        if group is None:  # a duplicate (issue 37)
            done[i] = send.dedup.settled(broker, send)
            continue
        hit = PyDict_GetItem(fills, group)
        if hit == NULL:
            f = _put_fill(broker, group, put_outcome)
            fills[group] = f
        else:
            f = <_PutFill>hit
        if f.outcome is None:
            continue
        if f.python or not _settle_direct or _slot(send, _o_ctx) is not None:
            fill(broker, send, group, f.outcome)
        else:
            _fill_one(send, group, f)
        done[i] = True


# --------------------------------------------------------------------------- put (coalesced)
# ``SendService.put`` (send.py) and ``put.store_group`` compiled for the lane's sends (session 11):
# a read's sends grouped per (topic, queue id, transaction type) in order, each group filled slot
# by slot (``PutGroup.add``) and put with the store's own ``put_message``/``put_messages``; a put
# refused for one message is redone in halves by the Python ``store_group`` itself.  The put's
# outcome (``put._put_outcome``) is read here too when its futures are plain ``StoreFuture``s:
# their slots, not three method calls each.  Anything else (another class, a cancelled future, a
# refused put) goes through the Python functions, the reference.

cdef bint _put_bound = False
cdef bint _put_direct = False
cdef object _SendService = None
cdef object _PutGroup = None
cdef object _py_put_halves = None
cdef object _py_put_outcome = None
cdef object _py_outcome = None
cdef object _Duplicate = None
cdef object _put_log = None
cdef object _perf_counter = None
cdef object _ONE_MESSAGE = None
cdef object _PUT_OK = None
cdef object _REPLICA_OK = None
cdef object _SUCCESS = None
cdef object _EMPTY_FLOAT = 0.0
cdef int64_t _GROUP_MAX = 0
# PutGroup's slots (a plain slotted class built here when its __init__ only stores constants).
cdef Py_ssize_t _g_sends, _g_nsends, _g_msgs, _g_nbytes, _g_future, _g_result, _g_error
cdef Py_ssize_t _g_replica, _g_started
cdef bint _g_build = False
# Send's slots read here (besides settle's).
cdef Py_ssize_t _s_batch, _s_nbytes
# StoreFuture's state slots (-1: not a slotted StoreFuture: its methods are called).
cdef object _StoreFuture = None
cdef Py_ssize_t _f_state = -1, _f_exc = -1, _f_result = -1
cdef int _TX_TYPE_MASK = 3 << 2
# ``tidemq.store.group_put`` and its cache (store class -> whether it has put_message_groups).
cdef object _py_group_put = None
cdef dict _group_put_of = None


cdef Py_ssize_t _member(cls, str name):
    """The member offset of slot ``name`` defined by ``cls`` itself, or -1."""
    descr = cls.__dict__.get(name)
    if descr is None:
        return -1
    return tq_member_offset(<PyObject *>descr)


cdef int _bind_put() except -1:
    global _put_bound, _put_direct, _SendService, _PutGroup, _py_put_halves, _py_put_outcome
    global _py_outcome, _Duplicate, _put_log, _perf_counter, _ONE_MESSAGE, _PUT_OK, _REPLICA_OK
    global _SUCCESS, _GROUP_MAX, _g_sends, _g_nsends, _g_msgs, _g_nbytes, _g_future, _g_result
    global _g_error, _g_replica, _g_started, _g_build, _s_batch, _s_nbytes, _StoreFuture
    global _f_state, _f_exc, _f_result, _py_group_put, _group_put_of
    import time

    from tidemq import store as store_module

    from tidemq.broker import dedup
    from tidemq.broker.services import put, send
    from tidemq.futures import StoreFuture

    if not _settle_bound:
        _bind_settle()
    _put_bound = True
    _SendService = send.SendService
    _PutGroup = put.PutGroup
    _py_put_halves = put.put_halves
    _py_put_outcome = put._put_outcome
    _py_outcome = put._outcome
    _Duplicate = dedup.Duplicate
    _put_log = put.log
    _perf_counter = time.perf_counter
    _ONE_MESSAGE = put._ONE_MESSAGE_STATUSES
    _PUT_OK = put._PUT_OK
    _REPLICA_OK = put._REPLICA_OK
    _SUCCESS = put._SUCCESS
    _GROUP_MAX = send.GROUP_MAX_BYTES
    _py_group_put = store_module.group_put
    _group_put_of = store_module._GROUP_PUT
    if (
        send.TRANSACTION_TYPE_MASK != _TX_TYPE_MASK
        or send.store_group is not put.store_group
        or send.store_groups is not put.store_groups
        or put.group_put is not store_module.group_put
    ):
        return 0
    _StoreFuture = StoreFuture
    _f_state = _member(StoreFuture, "_sf_state")
    _f_exc = _member(StoreFuture, "_sf_exc")
    _f_result = _member(StoreFuture, "_sf_result")
    if _f_state < 0 or _f_exc < 0 or _f_result < 0:
        _f_state = -1
    if not _settle_direct:
        return 0
    slots = _slot_names(_Send)
    gslots = _slot_names(_PutGroup)
    if slots is None or gslots is None:
        return 0
    offs = dict(slots)
    goffs = dict(gslots)
    try:
        _s_batch, _s_nbytes = offs["batch"], offs["nbytes"]
        _g_sends, _g_nsends, _g_msgs = goffs["sends"], goffs["nsends"], goffs["msgs"]
        _g_nbytes, _g_future, _g_result = goffs["nbytes"], goffs["future"], goffs["result"]
        _g_error, _g_replica, _g_started = goffs["error"], goffs["replica"], goffs["started"]
    except KeyError:
        return 0
    # Built slot by slot only when a fresh group is exactly these nine slots, as probed here.
    probe = _PutGroup()
    _g_build = (
        len(gslots) == 9
        and _PutGroup.__new__ is object.__new__
        and type(probe.sends) is list and not probe.sends
        and type(probe.msgs) is list and not probe.msgs
        and probe.nsends == 0 and type(probe.nsends) is int
        and probe.nbytes == 0 and type(probe.nbytes) is int
        and probe.future is None and probe.result is None and probe.error is None
        and probe.replica is None and probe.started == 0.0 and type(probe.started) is float
    )
    _put_direct = True
    return 0


cdef object _new_group():
    """``PutGroup()``."""
    if not _g_build:
        return _PutGroup()
    group = _new(_PutGroup)
    cdef PyObject *g = <PyObject *>group
    cdef list sends = [], msgs = []
    tq_set_slot(g, _g_sends, <PyObject *>sends)
    tq_set_slot(g, _g_nsends, <PyObject *>ZERO)
    tq_set_slot(g, _g_msgs, <PyObject *>msgs)
    tq_set_slot(g, _g_nbytes, <PyObject *>ZERO)
    tq_set_slot(g, _g_future, <PyObject *>None)
    tq_set_slot(g, _g_result, <PyObject *>None)
    tq_set_slot(g, _g_error, <PyObject *>None)
    tq_set_slot(g, _g_replica, <PyObject *>None)
    tq_set_slot(g, _g_started, <PyObject *>_EMPTY_FLOAT)
    return group


cdef inline int _future_state(object future, PyObject **exc, PyObject **result):
    """A plain StoreFuture's state (0 pending, 1 done, 2 cancelled), its exception and result
    borrowed; -1: not one (its methods are asked)."""
    cdef PyObject *state
    if _f_state < 0 or type(future) is not _StoreFuture:
        return -1
    state = tq_get_slot(<PyObject *>future, _f_state)
    exc[0] = tq_get_slot(<PyObject *>future, _f_exc)
    result[0] = tq_get_slot(<PyObject *>future, _f_result)
    if state == NULL or exc[0] == NULL or result[0] == NULL or not PyLong_CheckExact(<object>state):
        return -1
    if <object>state == 0:
        return 0
    if <object>state == 1:
        return 1
    return -1  # cancelled (or odd): the methods raise as they do


cdef int _store_group(object broker, object group) except -1:
    """``put.store_group``: put the group's messages; a coalesced put refused for one message is
    redone in halves by the Python function."""
    cdef PyObject *g = <PyObject *>group
    cdef Py_ssize_t nsends
    store = broker.store
    cdef list fresh = []
    msgs = <list>_slot(group, _g_msgs)
    sends = <list>_slot(group, _g_sends)
    tq_set_slot(g, _g_sends, <PyObject *>fresh)
    nsends = len(sends)
    tq_slot_long(g, _g_nsends, nsends)
    started = _perf_counter()
    tq_set_slot(g, _g_started, <PyObject *>started)
    try:
        if len(msgs) == 1 and not _slot(sends[0], _s_batch):
            future = store.put_message(msgs[0])
        else:
            future = store.put_messages(msgs)
    except Exception as exc_obj:
        _put_log.error("store refused a message for %s", msgs[0].topic, exc_info=exc_obj)
        text = str(exc_obj)
        tq_set_slot(g, _g_error, <PyObject *>text)
        return 0
    tq_set_slot(g, _g_future, <PyObject *>future)
    if nsends > 1 and _refused_for_one(future):
        _py_put_halves(broker, sends)  # nothing was stored: each half on its own, in order
    return 0


cdef bint _refused_for_one(object future) except -1:
    """The put's future answered, without an exception, a refusal caused by one message
    (nothing of the group stored: ``put._ONE_MESSAGE_STATUSES``)."""
    cdef PyObject *exc
    cdef PyObject *res
    cdef int state = _future_state(future, &exc, &res)
    if state == 0:
        return False
    if state == 1:
        if exc != <PyObject *>None:
            return False
        status = (<object>res).status
        return status is not _PUT_OK and status in _ONE_MESSAGE
    return future.done() and future.exception() is None and future.result().status in _ONE_MESSAGE


def put_sends(object service, list sends):
    """``service.put(sends)`` (:meth:`SendService.put`): the same groups, puts and order of
    effects, compiled where the classes are the ones this module knows (else the method itself)."""
    if not _put_bound:
        _bind_put()
    if not _put_direct or type(service) is not _SendService:
        service.put(sends)
        return
    cdef Py_ssize_t n = len(sends)
    if n == 0:
        return
    # Per send its queue id, transaction type and size as C values, per group the same.
    cdef int64_t *buf = <int64_t *>PyMem_Malloc(6 * n * sizeof(int64_t))
    if buf == NULL:
        raise MemoryError()
    try:
        if _group_keys(sends, n, buf, buf + n, buf + 2 * n) < 0:
            service.put(sends)  # an odd send: the method decides (nothing done yet)
            return
        _put_groups(service.broker, sends, n, buf, buf + n, buf + 2 * n, buf + 3 * n, buf + 4 * n, buf + 5 * n)
    finally:
        PyMem_Free(buf)


cdef int _group_keys(list sends, Py_ssize_t n, int64_t *sq, int64_t *stx, int64_t *sbytes) except -2:
    """Each send's queue id, transaction type and size; -1 (nothing read further) when a send is
    not one this put takes: not exactly ``Send``, a duplicate, no plain ``MessageInner`` first, a
    topic, queue id, flag or size not a plain ``str``/``int`` in range."""
    cdef Py_ssize_t i, j
    cdef int overflow = 0
    cdef PyObject *v
    cdef object send, msgs, first
    for i in range(n):
        send = sends[i]
        if type(send) is not _Send or type(_slot(send, _o_dedup)) is _Duplicate:
            return -1
        msgs = _slot(send, _o_msgs)
        if type(msgs) is not list or not msgs:
            return -1
        first = (<list>msgs)[0]
        if Py_TYPE(first) != <PyTypeObject *>MessageInner or _inner_off[0] < 0:
            return -1
        for j in (0, 2, 5):
            v = tq_get_slot(<PyObject *>first, _inner_off[j])
            if v == NULL:
                return -1
            if j == 0:
                if not PyUnicode_CheckExact(<object>v):
                    return -1
            elif not PyLong_CheckExact(<object>v):
                return -1
        sq[i] = raw_as_ll(<object>tq_get_slot(<PyObject *>first, _inner_off[2]), &overflow)
        if overflow:
            return -1
        stx[i] = <int64_t>(raw_as_ull_mask(<object>tq_get_slot(<PyObject *>first, _inner_off[5])) & _TX_TYPE_MASK)
        v = tq_get_slot(<PyObject *>send, _s_nbytes)
        if v == NULL or not PyLong_CheckExact(<object>v):
            return -1
        sbytes[i] = raw_as_ll(<object>v, &overflow)
        if overflow or sbytes[i] < 0 or sbytes[i] > (1 << 48):
            return -1
    return 0


cdef int _put_groups(
    object broker, list sends, Py_ssize_t n, int64_t *sq, int64_t *stx, int64_t *sbytes,
    int64_t *gq, int64_t *gtx, int64_t *gbytes
) except -1:
    """``SendService.put``'s loop: a group per (topic, queue id, transaction type) in first-seen
    order (``gbytes`` its size so far, -1 once cut), cut and put at ``GROUP_MAX_BYTES``, the rest
    put in order."""
    cdef Py_ssize_t i, j, ngroups = 0
    cdef object send, msgs, topic, group
    cdef list gtopics = [], ggroups = [], gmsgs, full = []
    for i in range(n):
        send = sends[i]
        msgs = _slot(send, _o_msgs)
        topic = <object>tq_get_slot(<PyObject *>(<list>msgs)[0], _inner_off[0])
        group = None
        for j in range(ngroups):
            if gq[j] == sq[i] and gtx[j] == stx[i] and gbytes[j] >= 0:
                if gtopics[j] is topic or gtopics[j] == topic:
                    group = ggroups[j]
                    break
        if group is None:
            group = _new_group()
            j = ngroups
            ngroups += 1
            gq[j] = sq[i]
            gtx[j] = stx[i]
            gbytes[j] = 0
            gtopics.append(topic)
            ggroups.append(group)
        # PutGroup.add, then the group's size
        tq_set_slot(<PyObject *>send, _o_group, <PyObject *>group)
        gmsgs = <list>_slot(group, _g_msgs)
        tq_slot_long(<PyObject *>send, _o_index, len(gmsgs))
        (<list>_slot(group, _g_sends)).append(send)
        if len(<list>msgs) == 1:
            gmsgs.append((<list>msgs)[0])
        else:
            gmsgs.extend(msgs)
        gbytes[j] += sbytes[i]
        tq_slot_long(<PyObject *>group, _g_nbytes, gbytes[j])
        if gbytes[j] >= _GROUP_MAX:
            gbytes[j] = -1  # ``del groups[key]``: a later send of the key opens a new group
            ggroups[j] = None
            full.append(group)  # put first, in the order cut
    for j in range(ngroups):
        group = ggroups[j]
        if group is not None:
            full.append(group)
    if len(full) == 1:
        _store_group(broker, full[0])
    elif full:
        _store_groups(broker, full)
    return 0


cdef int _store_groups(object broker, list groups) except -1:
    """``put.store_groups``: the groups' puts in one store call where the store offers it
    (``tidemq.store.GroupPut``), else one ``_store_group`` each."""
    cdef Py_ssize_t n = len(groups), i = 0, j, k
    cdef list rest, sends, last_sends, fresh, msgs_of
    cdef PyObject *g
    store = broker.store
    cls = type(store)
    capable = _group_put_of.get(cls)
    if capable is None:
        _py_group_put(store)  # fills the cache
        capable = _group_put_of.get(cls)
    if not capable:
        for group in groups:
            _store_group(broker, group)
        return 0
    put_groups = store.put_message_groups
    while i < n:
        if i == n - 1:
            _store_group(broker, groups[i])
            return 0
        rest = groups[i:] if i else groups
        msgs_of = [_slot(group, _g_msgs) for group in rest]
        started = _perf_counter()
        try:
            futures = put_groups(msgs_of)
        except Exception:
            _store_group(broker, groups[i])  # nothing was put: the first group alone
            i += 1
            continue
        if type(futures) is not list:
            futures = list(futures)
        k = len(<list>futures)
        if k == 0 or k > len(rest):
            raise RuntimeError(f"{cls.__name__}.put_message_groups put {k} of {len(rest)} groups")
        last_sends = None
        for j in range(k):
            group = rest[j]
            g = <PyObject *>group
            last_sends = <list>_slot(group, _g_sends)
            fresh = []
            tq_set_slot(g, _g_sends, <PyObject *>fresh)
            tq_slot_long(g, _g_nsends, len(last_sends))
            tq_set_slot(g, _g_started, <PyObject *>started)
            tq_set_slot(g, _g_future, <PyObject *>(<list>futures)[j])
        i += k
        if len(last_sends) > 1 and _refused_for_one((<list>futures)[k - 1]):
            _py_put_halves(broker, last_sends)  # as _store_group, before the rest
    return 0


cdef object _put_outcome_c(object broker, object group):
    """``put._put_outcome``: the put's outcome when it and its replicas answered already; None
    when it has to wait."""
    cdef PyObject *exc
    cdef PyObject *res
    cdef int state
    cdef object result, error, future, rf, replica, msgs, role_aware, epoch
    result = _slot(group, _g_result)
    error = _slot(group, _g_error)
    if result is None and error is None:
        future = _slot(group, _g_future)
        state = _future_state(future, &exc, &res)
        if state < 0:
            return _py_put_outcome(broker, group)
        if state == 0 or exc != <PyObject *>None:
            return None
        result = <object>res
        tq_set_slot(<PyObject *>group, _g_result, res)
    replica = None
    if result is not None and result.status is _PUT_OK:
        rf = _slot(group, _g_replica)
        if rf is None:
            # put._replica_future: counted once per put, then the replicas asked
            stats = broker.stats
            msgs = _slot(group, _g_msgs)
            stats.on_put(msgs[0].topic, result.message_count or len(msgs), result.wrote_bytes)
            stats.put_seconds.observe(_perf_counter() - _slot(group, _g_started))
            rf = broker.replication.wait_for_replicas(result.wrote_offset + result.wrote_bytes)
            tq_set_slot(<PyObject *>group, _g_replica, <PyObject *>rf)
        state = _future_state(rf, &exc, &res)
        if state < 0:
            if not rf.done() or rf.exception() is not None:
                return None
            replica = rf.result()
        elif state == 0 or exc != <PyObject *>None:
            return None
        else:
            replica = <object>res
        if replica is _REPLICA_OK and not result.error:
            # put._outcome's plain case: stored and acknowledged
            role_aware = broker.role_aware
            epoch = role_aware.current_epoch() if role_aware is not None else None
            return (_SUCCESS, None, epoch)
    return _py_outcome(broker, group, replica)
