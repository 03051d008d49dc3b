"""The trace recorders of tidemq's client (RocketMQ's SendMessageTraceHookImpl,
ConsumeMessageTraceHookImpl and EndTransactionTraceHookImpl).

A client built with ``enable_msg_trace=True`` holds a :class:`Tracer`; its send, consume and
end-transaction paths call it (``if self.tracer is not None``), so a client without tracing pays
nothing per message.  The tracer builds :class:`~tidemq.trace.format.TraceContext` values and
appends them to its :class:`~tidemq.trace.dispatcher.TraceDispatcher`; it never raises into the
traced path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidemq.message import MessageExt, Prop
from tidemq.trace.dispatcher import TraceDispatcher
from tidemq.trace.format import MessageType, TraceBean, TraceContext, TraceType

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.message import Message, SendResult

log = logging.getLogger(__name__)

#: The region written when the broker names none (MixAll.DEFAULT_TRACE_REGION_ID).
DEFAULT_REGION = "DefaultRegion"

#: RocketMQ 5's timer properties (TopicMessageType.parseFromMessageProperty counts them DELAY).
_TIMER_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")

#: ConsumeReturnType ordinals, the SubAfter record's context code.
CONSUME_SUCCESS, CONSUME_TIME_OUT, CONSUME_EXCEPTION, CONSUME_RETURN_NULL, CONSUME_FAILED = range(5)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _msg_type(props: dict[str, str]) -> MessageType:
    # As DefaultMQProducerImpl.sendKernelImpl: a prepared message is a half, a DELAY one delayed.
    if props.get(Prop.TRANSACTION_PREPARED) == "true":
        return MessageType.TRANS_HALF
    if props.get(Prop.DELAY_TIME_LEVEL) not in (None, "", "0"):
        return MessageType.DELAY
    if any(name in props for name in _TIMER_PROPERTIES):  # RocketMQ 5's timer: a delayed message
        return MessageType.DELAY
    return MessageType.NORMAL


class Tracer:
    """Builds trace contexts for one client and hands them to its dispatcher."""

    def __init__(self, group: str, dispatcher: TraceDispatcher) -> None:
        self.group = group
        self.dispatcher = dispatcher

    @property
    def trace_topic(self) -> str:
        return self.dispatcher.trace_topic

    async def start(self) -> None:
        await self.dispatcher.start()

    async def shutdown(self) -> None:
        await self.dispatcher.shutdown()

    # ------------------------------------------------------------------ producer
    def pub(
        self,
        topic: str,
        props: dict[str, str],
        body_length: int,
        broker_addr: str,
        begin: float,
        result: SendResult | None,
        batch: bool,
    ) -> None:
        """One send attempt that got an answer (``begin`` is its ``time.monotonic()``).

        As RocketMQ, an attempt without a result (oneway, or failed with an error) is not
        traced.  A batch gives one Pub per message (RocketMQ writes one record with the joined
        ids, which a query by one id cannot find); their tags and keys are not known here.
        """
        if result is None or topic.startswith(self.trace_topic):
            return
        try:
            cost = int((time.monotonic() - begin) * 1000)
            stamp = _now_ms() - cost
            ids = result.msg_id.split(",") if batch else [result.msg_id]
            offsets = result.offset_msg_id.split(",") if batch else [result.offset_msg_id]
            offsets += [""] * (len(ids) - len(offsets))
            for msg_id, offset_id in zip(ids, offsets, strict=False):
                bean = TraceBean(
                    topic=topic,
                    msg_id=msg_id,
                    offset_msg_id=offset_id,
                    tags="" if batch else props.get(Prop.TAGS, ""),
                    keys="" if batch else props.get(Prop.KEYS, ""),
                    store_host=broker_addr,
                    store_time=stamp + cost // 2,
                    body_length=body_length // len(ids),
                    msg_type=_msg_type(props),
                )
                self.dispatcher.append(
                    TraceContext(
                        TraceType.PUB,
                        time_stamp=stamp,
                        region_id=result.region_id or DEFAULT_REGION,
                        group_name=self.group,
                        cost_time=cost,
                        is_success=result.status.value == "SEND_OK",
                        beans=[bean],
                    )
                )
        except Exception:  # tracing must never fail a send
            log.exception("cannot record the trace of a send to %s", topic)

    # ------------------------------------------------------------------ push consumer
    def sub_before(self, msgs: Sequence[MessageExt]) -> TraceContext | None:
        """SubBefore for a batch about to reach the listener; ``None`` when nothing is traced."""
        beans: list[TraceBean] = []
        region = ""
        for m in msgs:
            if m.properties.get(Prop.TRACE_SWITCH) == "false":
                continue  # the sender switched tracing off for this message
            region = m.properties.get(Prop.MSG_REGION, region)
            beans.append(
                TraceBean(
                    topic=m.topic,
                    msg_id=m.uniq_key or m.msg_id,
                    tags=m.tags or "",
                    keys=" ".join(m.keys),
                    store_time=m.store_timestamp,
                    body_length=m.store_size,
                    retry_times=m.reconsume_times,
                )
            )
        if not beans:
            return None
        from tidemq.client.message import new_message_id  # the client package imports this module

        ctx = TraceContext(
            TraceType.SUB_BEFORE,
            time_stamp=_now_ms(),
            region_id=region or DEFAULT_REGION,
            group_name=self.group,
            request_id=new_message_id(),
            beans=beans,
        )
        self.dispatcher.append(ctx)
        return ctx

    def sub_after(self, before: TraceContext | None, count: int, ok: bool, raised: bool = False) -> None:
        """SubAfter for the batch ``before`` was recorded for (``raised``: the listener raised)."""
        if before is None:
            return
        code = CONSUME_SUCCESS if ok else CONSUME_EXCEPTION if raised else CONSUME_FAILED
        self.dispatcher.append(
            TraceContext(
                TraceType.SUB_AFTER,
                time_stamp=_now_ms(),
                region_id=before.region_id,
                group_name=before.group_name,
                request_id=before.request_id,
                cost_time=(_now_ms() - before.time_stamp) // max(1, count),
                is_success=ok,
                context_code=code,
                beans=before.beans,
            )
        )

    # ------------------------------------------------------------------ transactions
    def end_transaction(
        self,
        msg: Message | MessageExt,
        msg_id: str,
        broker_addr: str,
        state: str,
        transaction_id: str,
        from_check: bool,
    ) -> None:
        """The END_TRANSACTION a transaction producer sends (``state``: COMMIT_MESSAGE...)."""
        if msg.topic.startswith(self.trace_topic):
            return
        if isinstance(msg, MessageExt):
            tags, keys, region = msg.tags or "", " ".join(msg.keys), msg.properties.get(Prop.MSG_REGION, "")
        else:
            props = msg.wire_properties()
            tags, keys, region = props.get(Prop.TAGS, ""), props.get(Prop.KEYS, ""), ""
        self.dispatcher.append(
            TraceContext(
                TraceType.END_TRANSACTION,
                time_stamp=_now_ms(),
                region_id=region or DEFAULT_REGION,
                group_name=self.group,
                beans=[
                    TraceBean(
                        topic=msg.topic,
                        msg_id=msg_id,
                        tags=tags,
                        keys=keys,
                        store_host=broker_addr,
                        msg_type=MessageType.TRANS_COMMIT,
                        transaction_id=transaction_id,
                        transaction_state=state,
                        from_transaction_check=from_check,
                    )
                ],
            )
        )


def make_tracer(
    group: str,
    kind: str,
    instance: ClientInstance,
    enable: bool,
    trace_topic: str | None,
    queue_size: int = 2048,
) -> Tracer | None:
    """The tracer of a client built with ``enable_msg_trace`` (``None`` when it is off)."""
    if not enable:
        return None
    return Tracer(
        group, TraceDispatcher(group, kind, instance, trace_topic=trace_topic, queue_size=queue_size)
    )
