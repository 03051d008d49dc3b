"""The trace of a timer message's second step: its delivery to its real topic.

With message trace on (``trace_topic_enable``), the producer's send is traced by the producer
(a ``Pub`` record, message type ``DELAY``, the topic it named, stored in rmq_sys_wheel_timer);
the broker writes the second step itself when the wheel puts the message to its real topic: a
``Pub`` record of group :data:`TIMER_TRACE_GROUP` with the same message id, the real topic, the
new offset message id, the delivery's store time and its lateness as the cost.  RocketMQ's
``TraceType`` has no kind of its own for this (Pub, SubBefore, SubAfter, EndTransaction), so
``queryMsgTraceById``, the console and RocketMQ's tools show it as a second send of the message.
The records of one delivery window go as one message to the broker's trace topic, indexed by the
message ids and keys; a message sent with ``TRACE_ON=false`` is not traced.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tidemq.futures import resolved
from tidemq.message import MessageInner, Prop
from tidemq.store import PutResult
from tidemq.trace.format import MessageType, TraceBean, TraceContext, TraceType, encode_context, trace_keys

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: The group name of the broker's delivery records (the timer's system topic).
TIMER_TRACE_GROUP = "rmq_sys_wheel_timer"
#: The region written in the records (MixAll.DEFAULT_TRACE_REGION_ID).
DEFAULT_REGION = "DefaultRegion"


class TimerTrace:
    """Collects the delivery records of one window and stores them in the trace topic."""

    def __init__(self, broker: BrokerContext) -> None:
        s = broker.settings
        self.broker = broker
        self.enabled: bool = bool(s.trace_topic_enable)
        self.topic: str = s.msg_trace_topic_name
        #: Delivery records written to the trace topic / not written (the put failed).
        self.written = 0
        self.failed = 0

    def record(self, msg: MessageInner, result: PutResult, due_ms: int) -> TraceContext | None:
        """The record of one delivery (None when its producer switched tracing off)."""
        props = msg.properties
        if props.get(Prop.TRACE_SWITCH) == "false":
            return None
        bean = TraceBean(
            topic=msg.topic,
            msg_id=props.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "") or result.msg_id,
            offset_msg_id=result.msg_id,
            tags=props.get(Prop.TAGS, ""),
            keys=props.get(Prop.KEYS, ""),
            store_host="{}:{}".format(*self.broker.store_host),
            store_time=result.store_timestamp,
            body_length=len(msg.body),
            msg_type=MessageType.DELAY,
        )
        return TraceContext(
            TraceType.PUB,
            time_stamp=result.store_timestamp or int(time.time() * 1000),
            region_id=props.get(Prop.MSG_REGION, "") or DEFAULT_REGION,
            group_name=TIMER_TRACE_GROUP,
            cost_time=max(0, result.store_timestamp - due_ms),
            is_success=True,
            beans=[bean],
        )

    async def write(self, contexts: list[TraceContext]) -> None:
        """Store the records as one trace message (never raises: tracing never fails a delivery)."""
        if not contexts:
            return
        try:
            text = "".join(encode_context(c) for c in contexts)
            keys = list(dict.fromkeys(k for c in contexts for k in trace_keys(c)))
            now = int(time.time() * 1000)
            msg = MessageInner(
                topic=self.topic,
                body=text.encode(),
                properties={Prop.KEYS: " ".join(keys), Prop.WAIT_STORE_MSG_OK: "false"},
                born_timestamp=now,
                born_host=self.broker.store_host,
                store_host=self.broker.store_host,
            )
            result = await resolved(self.broker.store.put_message(msg))
            if not result.ok:
                raise RuntimeError(result.status.value)
        except Exception as exc:
            self.failed += len(contexts)
            log.warning("timer: trace of %d deliveries not written to %s: %s", len(contexts), self.topic, exc)
            return
        self.written += len(contexts)
        self.broker.stats.on_put(self.topic, 1, result.wrote_bytes)
