"""RocketMQ message-trace records: the value types and the text format.

The text is what RocketMQ 4.4+'s ``TraceDataEncoder`` writes as the body of a message on the
trace topic: one record per traced message, fields separated by :data:`CONTENT_SPLITOR`
(``\\x01``), each record ended by :data:`FIELD_SPLITOR` (``\\x02``).  Field order per type:

* ``Pub``: type, timestamp, region id, group, topic, msg id, tags, keys, store host, body
  length, cost time, msg type ordinal, offset msg id, success.
* ``SubBefore``: type, timestamp, region id, group, request id, msg id, retry times, keys.
* ``SubAfter``: type, request id, msg id, cost time, success, keys, context code, timestamp.
* ``EndTransaction``: type, timestamp, region id, group, topic, msg id, tags, keys, store
  host, msg type ordinal, transaction id, transaction state, from transaction check.

Booleans are Java's ``true``/``false``.  Decoding is lenient where Java's is not: a record with
missing trailing fields (Java's ``split`` drops trailing empty strings) reads them as empty, and
a record that cannot be read at all is skipped with a log line.
"""

from __future__ import annotations

import enum
import logging

import attrs

log = logging.getLogger(__name__)

#: Between the fields of one record (TraceConstants.CONTENT_SPLITOR).
CONTENT_SPLITOR = "\x01"
#: After each record (TraceConstants.FIELD_SPLITOR).
FIELD_SPLITOR = "\x02"
#: The default trace topic (TopicValidator.RMQ_SYS_TRACE_TOPIC).
DEFAULT_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


class TraceType(enum.StrEnum):
    """The kind of traced event (TraceType)."""

    PUB = "Pub"
    SUB_BEFORE = "SubBefore"
    SUB_AFTER = "SubAfter"
    END_TRANSACTION = "EndTransaction"


class MessageType(enum.IntEnum):
    """The traced message's kind; the values are the Java enum's ordinals (MessageType)."""

    NORMAL = 0
    TRANS_HALF = 1
    TRANS_COMMIT = 2
    DELAY = 3


@attrs.define
class TraceBean:
    """One message inside a trace context (TraceBean)."""

    topic: str = ""
    msg_id: str = ""
    offset_msg_id: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    client_host: str = ""
    store_time: int = 0
    retry_times: int = 0
    body_length: int = 0
    msg_type: MessageType | None = None
    transaction_state: str = ""
    transaction_id: str = ""
    from_transaction_check: bool = False


@attrs.define
class TraceContext:
    """One traced event: a send, a consume before/after, an end-transaction (TraceContext).

    ``time_stamp`` and ``cost_time`` are milliseconds.
    """

    trace_type: TraceType
    time_stamp: int = 0
    region_id: str = ""
    region_name: str = ""
    group_name: str = ""
    cost_time: int = 0
    is_success: bool = True
    request_id: str = ""
    context_code: int = 0
    beans: list[TraceBean] = attrs.Factory(list)


def _jbool(value: bool) -> str:
    return "true" if value else "false"


def _record(fields: list[object]) -> str:
    return CONTENT_SPLITOR.join(str(f) for f in fields) + FIELD_SPLITOR


def _ordinal(msg_type: MessageType | None) -> int:
    # Java would throw on a null type; a record without one is written as a normal message.
    return int(msg_type) if msg_type is not None else int(MessageType.NORMAL)


def encode_context(ctx: TraceContext) -> str:
    """Encode one context as RocketMQ's ``TraceDataEncoder.encoderFromContextBean`` does.

    Pub and EndTransaction write their first bean only; SubBefore and SubAfter write one record
    per bean.  A context without beans encodes to the empty string.
    """
    if not ctx.beans:
        return ""
    tt = ctx.trace_type
    if tt is TraceType.PUB:
        b = ctx.beans[0]
        return _record(
            [
                tt.value,
                ctx.time_stamp,
                ctx.region_id,
                ctx.group_name,
                b.topic,
                b.msg_id,
                b.tags,
                b.keys,
                b.store_host,
                b.body_length,
                ctx.cost_time,
                _ordinal(b.msg_type),
                b.offset_msg_id,
                _jbool(ctx.is_success),
            ]
        )
    if tt is TraceType.SUB_BEFORE:
        return "".join(
            _record(
                [
                    tt.value,
                    ctx.time_stamp,
                    ctx.region_id,
                    ctx.group_name,
                    ctx.request_id,
                    b.msg_id,
                    b.retry_times,
                    b.keys,
                ]
            )
            for b in ctx.beans
        )
    if tt is TraceType.SUB_AFTER:
        return "".join(
            _record(
                [
                    tt.value,
                    ctx.request_id,
                    b.msg_id,
                    ctx.cost_time,
                    _jbool(ctx.is_success),
                    b.keys,
                    ctx.context_code,
                    ctx.time_stamp,
                    ctx.group_name,
                ]
            )
            for b in ctx.beans
        )
    b = ctx.beans[0]
    return _record(
        [
            tt.value,
            ctx.time_stamp,
            ctx.region_id,
            ctx.group_name,
            b.topic,
            b.msg_id,
            b.tags,
            b.keys,
            b.store_host,
            _ordinal(b.msg_type),
            b.transaction_id,
            b.transaction_state,
            _jbool(ctx.beans[0].from_transaction_check),
        ]
    )


def trace_keys(ctx: TraceContext) -> list[str]:
    """The KEYS a trace message carrying ``ctx`` is indexed by: each bean's msg id and keys.

    As ``encoderFromContextBean``'s transKey set: a query by message id (or by the traced
    message's keys) on the trace topic finds the record.
    """
    out: list[str] = []
    for b in ctx.beans:
        if b.msg_id:
            out.append(b.msg_id)
        if b.keys:  # KEYS holds several keys separated by spaces (MessageConst.KEY_SEPARATOR)
            out.extend(k for k in b.keys.split(" ") if k)
    return out


_FIELD_COUNTS = {
    TraceType.PUB: 14,
    TraceType.SUB_BEFORE: 8,
    TraceType.SUB_AFTER: 9,
    TraceType.END_TRANSACTION: 13,
}
# The fewest fields a record must have to be read (older writers wrote fewer trailing fields).
_MIN_FIELDS = {
    TraceType.PUB: 12,
    TraceType.SUB_BEFORE: 6,
    TraceType.SUB_AFTER: 5,
    TraceType.END_TRANSACTION: 10,
}


def _int(text: str) -> int:
    return int(text) if text else 0


def _msg_type(text: str) -> MessageType:
    return MessageType(_int(text))


def _decode_record(line: list[str]) -> TraceContext:
    tt = TraceType(line[0])
    n = len(line)
    if n < _MIN_FIELDS[tt]:
        raise ValueError(f"{tt.value} record has {n} fields, needs at least {_MIN_FIELDS[tt]}")
    # Trailing empty fields may be missing (Java's split drops them): pad to the full width.
    f = line + [""] * (max(_FIELD_COUNTS[tt], 15) - n)
    if tt is TraceType.PUB:
        bean = TraceBean(
            topic=f[4],
            msg_id=f[5],
            tags=f[6],
            keys=f[7],
            store_host=f[8],
            body_length=_int(f[9]),
            msg_type=_msg_type(f[11]),
        )
        if n == 13:
            success = f[12]
        else:
            bean.offset_msg_id = f[12]
            success = f[13]
            bean.client_host = f[14]
        return TraceContext(
            tt,
            time_stamp=_int(f[1]),
            region_id=f[2],
            group_name=f[3],
            cost_time=_int(f[10]),
            is_success=success.lower() == "true",
            beans=[bean],
        )
    if tt is TraceType.SUB_BEFORE:
        return TraceContext(
            tt,
            time_stamp=_int(f[1]),
            region_id=f[2],
            group_name=f[3],
            request_id=f[4],
            beans=[TraceBean(msg_id=f[5], retry_times=_int(f[6]), keys=f[7])],
        )
    if tt is TraceType.SUB_AFTER:
        return TraceContext(
            tt,
            request_id=f[1],
            cost_time=_int(f[3]),
            is_success=f[4].lower() == "true",
            context_code=_int(f[6]),
            time_stamp=_int(f[7]),
            group_name=f[8],
            beans=[TraceBean(msg_id=f[2], keys=f[5])],
        )
    return TraceContext(
        tt,
        time_stamp=_int(f[1]),
        region_id=f[2],
        group_name=f[3],
        beans=[
            TraceBean(
                topic=f[4],
                msg_id=f[5],
                tags=f[6],
                keys=f[7],
                store_host=f[8],
                msg_type=_msg_type(f[9]),
                transaction_id=f[10],
                transaction_state=f[11],
                from_transaction_check=f[12].lower() == "true",
            )
        ],
    )


def decode_trace_data(text: str) -> list[TraceContext]:
    """Decode a trace message body as ``TraceDataEncoder.decoderFromTraceDataString`` does.

    Each record gives one context with one bean.  A malformed record (unknown type, too few
    fields, a number that is not one) is skipped with a log line; this never raises on bad text.
    """
    out: list[TraceContext] = []
    if not text:
        return out
    for record in text.split(FIELD_SPLITOR):
        if not record.strip():
            continue
        line = record.split(CONTENT_SPLITOR)
        try:
            out.append(_decode_record(line))
        except (ValueError, IndexError) as e:
            log.warning("skipping malformed trace record %r: %s", record[:80], e)
    return out
