"""Message trace (RocketMQ 4.4+'s msg trace): the record format and, for tidemq's client, the
asynchronous dispatcher and the send/consume/end-transaction recorders.

See ``docs/trace.md``.
"""

from tidemq.trace.dispatcher import TraceDispatcher
from tidemq.trace.format import (
    CONTENT_SPLITOR,
    DEFAULT_TRACE_TOPIC,
    FIELD_SPLITOR,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    decode_trace_data,
    encode_context,
    trace_keys,
)
from tidemq.trace.hooks import Tracer

__all__ = [
    "CONTENT_SPLITOR",
    "DEFAULT_TRACE_TOPIC",
    "FIELD_SPLITOR",
    "MessageType",
    "TraceBean",
    "TraceContext",
    "TraceDispatcher",
    "TraceType",
    "Tracer",
    "decode_trace_data",
    "encode_context",
    "trace_keys",
]
