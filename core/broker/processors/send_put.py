"""The store side of a send: one put per :class:`PutGroup`, one response per :class:`PendingSend`.

A group holds the messages of one send, or of several sends of one read coalesced into one put
(:class:`tidemq.broker.processors.send.SendHandler`): all to one topic and queue, in request
order.  The store answers a put with one :class:`~tidemq.store.PutResult`; a send whose ``n``
messages start at ``index`` in the put reads its message ids at ``msg_ids[index:index + n]`` and
its queue offset at ``queue_offset + index`` (the store gives a put consecutive offsets).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tidemq.broker.context import BrokerContext
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    Prop,
)
from tidemq.observe import SendContext
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.replication import ReplicaStatus
from tidemq.store import PutResult, PutStatus

log = logging.getLogger(__name__)

_PUT_CODES: dict[PutStatus, tuple[int, str | None]] = {
    PutStatus.PUT_OK: (ResponseCode.SUCCESS, None),
    PutStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, None),
    PutStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT, None),
    PutStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, None),
    PutStatus.SERVICE_NOT_AVAILABLE: (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        "service not available now, maybe disk full or the broker is a slave",
    ),
    PutStatus.DISK_FULL: (ResponseCode.SERVICE_NOT_AVAILABLE, "service not available now: the disk is full"),
    PutStatus.CREATE_MAPPED_FILE_FAILED: (
        ResponseCode.SYSTEM_ERROR,
        "create mapped file failed, server is busy or broken",
    ),
    PutStatus.MESSAGE_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, "the message is illegal"),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (
        ResponseCode.MESSAGE_ILLEGAL,
        "the message properties are too large",
    ),
    PutStatus.OS_PAGECACHE_BUSY: (
        ResponseCode.SYSTEM_BUSY,
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    ),
    PutStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
}
_REPLICA_CODES = {
    ReplicaStatus.PUT_OK: ResponseCode.SUCCESS,
    ReplicaStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ReplicaStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    # Fenced or deposed (controller mode): SERVICE_NOT_AVAILABLE makes clients retry another broker.
    ReplicaStatus.NOT_MASTER: ResponseCode.SERVICE_NOT_AVAILABLE,
}
#: Codes whose response carries the message id and queue offset (SendMessageResponseHeader).
_HEADER_CODES = frozenset(
    (
        ResponseCode.SUCCESS,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
    )
)
# Enum members as globals: an enum class attribute costs ~0.2 us a lookup, several per send.
_SUCCESS = ResponseCode.SUCCESS
_SYSTEM_ERROR = ResponseCode.SYSTEM_ERROR
_PUT_OK = PutStatus.PUT_OK
_REPLICA_OK = ReplicaStatus.PUT_OK
_NOT_MASTER = ReplicaStatus.NOT_MASTER
#: Put statuses caused by one message: a coalesced put that gets one is retried message by message.
_ONE_MESSAGE_STATUSES = frozenset((PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED))
#: Transaction types the store gives no consume-queue entry (every record of a put shares offset 0).
_NOT_CONSUMABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
#: A coalesced put is cut at this many body bytes: the put is packed into one buffer first.
GROUP_MAX_BYTES = 1024 * 1024


class PendingSend:
    """One send request between its steps: its messages, hook context and place in a put."""

    __slots__ = ("batch", "ctx", "group", "index", "msgs", "producer_group", "reply_queue_id", "request")

    def __init__(
        self,
        request: RemotingCommand,
        producer_group: str,
        msgs: list[MessageInner],
        batch: bool,
        ctx: SendContext | None,
        reply_queue_id: int,
    ) -> None:
        self.request = request
        self.producer_group = producer_group
        self.msgs = msgs
        self.batch = batch
        self.ctx = ctx
        self.reply_queue_id = reply_queue_id
        self.group: PutGroup | None = None
        self.index = 0  # of its (first) message in the group's put


class PutGroup:
    """One put: the messages of one or more sends, all to one topic and queue."""

    __slots__ = ("error", "future", "msgs", "nbytes", "nsends", "replica", "result", "sends", "started")

    def __init__(self) -> None:
        self.sends: list[PendingSend] = []  # until stored: sends point at their group, not back
        self.nsends = 0
        self.msgs: list[MessageInner] = []
        self.nbytes = 0  # request bodies coalesced so far (what GROUP_MAX_BYTES bounds)
        self.future: Any = None  # the store's concurrent Future[PutResult]
        self.result: PutResult | None = None
        # What the store raised, as text: the exception itself would hold this frame's caller
        # through its traceback (a cycle for the collector).
        self.error: str | None = None
        self.replica: Any = None  # Future[ReplicaStatus], asked once per put
        self.started = 0.0

    def add(self, send: PendingSend) -> None:
        send.group = self
        send.index = len(self.msgs)
        self.sends.append(send)
        self.msgs.extend(send.msgs)


def store_group(broker: BrokerContext, group: PutGroup) -> None:
    """Put ``group``'s messages; a put refused for one message is redone in halves, in order."""
    store = broker.store
    msgs = group.msgs
    # Forget the sends once stored: a send -> group -> send cycle would be left for the collector.
    sends, group.sends = group.sends, []
    group.nsends = len(sends)
    group.started = time.perf_counter()
    try:
        if len(msgs) == 1 and not sends[0].batch:
            future = store.put_message(msgs[0])
        else:
            future = store.put_messages(msgs)
    except Exception as exc:
        log.exception("store refused a message for %s", msgs[0].topic)
        group.error = str(exc)
        return
    group.future = future
    if (
        len(sends) > 1
        and future.done()
        and future.exception() is None
        and future.result().status in _ONE_MESSAGE_STATUSES
    ):
        # Nothing was stored.  Put each half on its own, in order, halving again where refused:
        # the bad message ends up alone and fails by itself, the rest stays coalesced.
        half = len(sends) // 2
        for part in (sends[:half], sends[half:]):
            regroup = PutGroup()
            for send in part:
                regroup.add(send)
            store_group(broker, regroup)


def answer_now(broker: BrokerContext, send: PendingSend) -> RemotingCommand | None:
    """``send``'s response when its put and replicas are done already (async flush: nearly every
    send), without a coroutine; None when it has to wait (:func:`finish`)."""
    group = send.group
    assert group is not None
    if group.result is None and group.error is None:
        future = group.future
        if not future.done() or future.exception() is not None:
            return None  # finish awaits it, or logs the failure
        group.result = future.result()
    replica = None
    result = group.result
    if result is not None and result.status is _PUT_OK:
        replica_future = _replica_future(broker, group, result)
        if not replica_future.done() or replica_future.exception() is not None:
            return None
        replica = replica_future.result()
    return _respond(broker, send, replica)


async def finish(broker: BrokerContext, send: PendingSend) -> RemotingCommand:
    """Wait for ``send``'s put and replicas, tell the hooks, answer."""
    group = send.group
    assert group is not None
    if group.result is None and group.error is None:
        try:
            group.result = await resolved(group.future)
        except Exception as exc:
            if group.error is None:
                log.exception("store refused a message for %s", group.msgs[0].topic)
                group.error = str(exc)
    replica = None
    result = group.result
    if result is not None and result.status is _PUT_OK:
        replica = await resolved(_replica_future(broker, group, result))
    return _respond(broker, send, replica)


def _replica_future(broker: BrokerContext, group: PutGroup, result: PutResult) -> Any:
    """Asked once per put, after counting it: the put's end must reach the replicas."""
    replica_future = group.replica
    if replica_future is None:
        stats = broker.stats
        stats.on_put(group.msgs[0].topic, result.message_count or len(group.msgs), result.wrote_bytes)
        stats.put_seconds.observe(time.perf_counter() - group.started)
        replica_future = group.replica = broker.replication.wait_for_replicas(
            result.wrote_offset + result.wrote_bytes
        )
    return replica_future


def _respond(broker: BrokerContext, send: PendingSend, replica: Any) -> RemotingCommand:
    """The response to ``send`` once its put (and, when it succeeded, its replicas) answered."""
    group = send.group
    assert group is not None
    request = send.request
    ctx = send.ctx
    result = group.result
    if result is None:  # the store raised
        if ctx is not None:
            ctx.status = "SYSTEM_ERROR"
            ctx.elapsed_ms = (time.perf_counter() - group.started) * 1000
            broker.hooks.tidemq_after_send(context=ctx)
        return request.reply(_SYSTEM_ERROR, f"store error: {group.error}")
    status = result.status
    code: int
    remark: str | None
    if status is _PUT_OK:  # skips hashing the enum (a Python-level __hash__)
        code, remark = _SUCCESS, None
    else:
        known = _PUT_CODES.get(status)
        code, remark = known if known is not None else (_SYSTEM_ERROR, status.value)
    if result.error:
        remark = f"{remark or status.value}: {result.error}"
    if status is _PUT_OK:
        code = _SUCCESS if replica is _REPLICA_OK else _REPLICA_CODES.get(replica, _SYSTEM_ERROR)
        if code == _SYSTEM_ERROR:
            remark = f"replication answered {replica}"
        elif replica is _NOT_MASTER:
            remark = (
                f"the broker[{broker.settings.name}] is not master (fenced): the message is not acknowledged"
            )
    if group.nsends == 1:
        msg_ids = result.msg_ids
        msg_id = msg_ids[0] if len(msg_ids) == 1 else result.msg_id
        queue_offset = result.queue_offset
    else:  # one of several sends coalesced into this put (a batch send: several messages)
        index = send.index
        ids = result.msg_ids
        count = len(send.msgs)
        if index + count > len(ids):
            msg_id = result.msg_id
        else:
            msg_id = ids[index] if count == 1 else ",".join(ids[index : index + count])
        first = group.msgs[0]
        consumable = first.sys_flag & TRANSACTION_TYPE_MASK not in _NOT_CONSUMABLE
        queue_offset = result.queue_offset + index if consumable else result.queue_offset
    if ctx is not None:
        ctx.status = ResponseCode(code).name
        ctx.msg_id = msg_id
        ctx.queue_offset = queue_offset
        ctx.elapsed_ms = (time.perf_counter() - group.started) * 1000
        broker.hooks.tidemq_after_send(context=ctx)
    role_aware = broker.role_aware
    if code not in _HEADER_CODES:
        if role_aware is not None:
            return request.reply(code, remark, {"epoch": str(role_aware.current_epoch())})
        return request.reply(code, remark)
    properties = send.msgs[0].properties
    fields = {
        "msgId": msg_id,
        "queueId": str(send.reply_queue_id),
        "queueOffset": str(queue_offset),
        "MSG_REGION": properties.get(Prop.MSG_REGION, "DefaultRegion"),
        "TRACE_ON": properties.get(Prop.TRACE_SWITCH, "true"),
    }
    if role_aware is not None:
        # Controller mode (issue 25): the epoch that acknowledged; RocketMQ clients ignore the key.
        fields["epoch"] = str(role_aware.current_epoch())
    if not send.batch and "TIMER_OUT_MS" in properties:  # a parked timer message (issue 36)
        handle = broker.timers.recall_handle(send.msgs[0])
        if handle is not None:
            fields["recallHandle"] = handle
    return request.reply_with(code, remark, fields)
