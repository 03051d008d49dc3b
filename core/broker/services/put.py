"""The store side of a send: one put per :class:`PutGroup`, one outcome per :class:`Send`.

A group holds the messages of one send, or of several sends of one read coalesced into one put
(:meth:`tidemq.broker.services.send.SendService.put`): all to one topic and queue, in request
order.  The store answers a put with one :class:`~tidemq.store.PutResult`; a send whose ``n``
messages start at ``index`` in the put reads its message ids at ``msg_ids[index:index + n]`` and
its queue offset at ``queue_offset + index`` (the store gives a put consecutive offsets).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from tidemq.broker.context import BrokerContext
from tidemq.broker.services.status import Status
from tidemq.extensions import compiled_twin
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageInner,
    Prop,
)
from tidemq.observe import SendContext
from tidemq.replication import ReplicaStatus
from tidemq.store import PutResult, PutStatus, group_put

if TYPE_CHECKING:
    from tidemq.broker.dedup import Duplicate, Sent

log = logging.getLogger(__name__)

_PUT_STATUSES: dict[PutStatus, tuple[Status, str | None]] = {
    PutStatus.PUT_OK: (Status.SUCCESS, None),
    PutStatus.FLUSH_DISK_TIMEOUT: (Status.FLUSH_DISK_TIMEOUT, None),
    PutStatus.FLUSH_SLAVE_TIMEOUT: (Status.FLUSH_SLAVE_TIMEOUT, None),
    PutStatus.SLAVE_NOT_AVAILABLE: (Status.SLAVE_NOT_AVAILABLE, None),
    PutStatus.SERVICE_NOT_AVAILABLE: (
        Status.SERVICE_NOT_AVAILABLE,
        "service not available now, maybe disk full or the broker is a slave",
    ),
    PutStatus.DISK_FULL: (Status.SERVICE_NOT_AVAILABLE, "service not available now: the disk is full"),
    PutStatus.CREATE_MAPPED_FILE_FAILED: (
        Status.SYSTEM_ERROR,
        "create mapped file failed, server is busy or broken",
    ),
    PutStatus.MESSAGE_ILLEGAL: (Status.MESSAGE_ILLEGAL, "the message is illegal"),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (Status.MESSAGE_ILLEGAL, "the message properties are too large"),
    PutStatus.OS_PAGECACHE_BUSY: (
        Status.SYSTEM_BUSY,
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    ),
    PutStatus.UNKNOWN_ERROR: (Status.SYSTEM_ERROR, "UNKNOWN_ERROR"),
}
_REPLICA_STATUSES: dict[ReplicaStatus | None, Status] = {
    ReplicaStatus.PUT_OK: Status.SUCCESS,
    ReplicaStatus.FLUSH_SLAVE_TIMEOUT: Status.FLUSH_SLAVE_TIMEOUT,
    ReplicaStatus.SLAVE_NOT_AVAILABLE: Status.SLAVE_NOT_AVAILABLE,
    # Fenced or deposed (controller mode): SERVICE_NOT_AVAILABLE makes clients retry another broker.
    ReplicaStatus.NOT_MASTER: Status.SERVICE_NOT_AVAILABLE,
}
#: Statuses of a stored send: its answer carries the message id and queue offset.
STORED = frozenset(
    (Status.SUCCESS, Status.FLUSH_DISK_TIMEOUT, Status.FLUSH_SLAVE_TIMEOUT, Status.SLAVE_NOT_AVAILABLE)
)
# Enum members as globals: an enum class attribute costs ~0.2 us a lookup, several per send.
_SUCCESS = Status.SUCCESS
_SYSTEM_ERROR = Status.SYSTEM_ERROR
_FLUSH_DISK_TIMEOUT = Status.FLUSH_DISK_TIMEOUT
_REAL_TOPIC = Prop.REAL_TOPIC
_PUT_OK = PutStatus.PUT_OK
_REPLICA_OK = ReplicaStatus.PUT_OK
_NOT_MASTER = ReplicaStatus.NOT_MASTER
#: Put statuses caused by one message: a coalesced put that gets one is retried message by message.
_ONE_MESSAGE_STATUSES = frozenset((PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED))
#: Transaction types the store gives no consume-queue entry (every record of a put shares offset 0).
_NOT_CONSUMABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
#: ``settle_sends(broker, sends, done, put_outcome, fill)``: :func:`settled_many`'s loop compiled
#: (per send the slots ``_fill`` sets, the window's ``stored``), or None: the Python loop.
_lane = compiled_twin("tidemq._native._send_lane")
_settle_sends = getattr(_lane, "settle_sends", None)
#: A coalesced put is cut at this many body bytes: the put is packed into one buffer first.
GROUP_MAX_BYTES = 1024 * 1024


class Send:
    """One send through :class:`~tidemq.broker.services.send.SendService`: its messages and hook
    context, its place in a put, then its outcome.

    The outcome fields (``status``, ``remark``, ``msg_id``, ``queue_offset``, ``epoch``) are set
    once the send is settled.  A plain slotted class and not an attrs one: one is made per send
    request on the hot path, and it is the result too (no second object per request).
    """

    __slots__ = (
        "batch",
        "ctx",
        "dedup",
        "epoch",
        "group",
        "index",
        "msg_id",
        "msgs",
        "nbytes",
        "producer_group",
        "queue_id",
        "queue_offset",
        "recall_handle",
        "remark",
        "status",
    )

    #: How the send ended (set when settled).
    status: Status
    #: Why, when it did not succeed (or the put's error text); None otherwise.
    remark: str | None
    #: The message id (comma-separated ids for a batch) and the queue offset of the first message.
    msg_id: str
    queue_offset: int
    #: Controller mode: the epoch that acknowledged (None otherwise).
    epoch: int | None

    def __init__(
        self,
        producer_group: str,
        msgs: list[MessageInner],
        batch: bool,
        ctx: SendContext | None,
        queue_id: int,
        nbytes: int,
    ) -> None:
        self.producer_group = producer_group
        self.msgs = msgs
        self.batch = batch
        self.ctx = ctx
        #: The queue the producer addressed (the answer's queueId, even when a delay moved it).
        self.queue_id = queue_id
        self.nbytes = nbytes  # body bytes of the request (what GROUP_MAX_BYTES bounds)
        self.group: PutGroup | None = None
        self.index = 0  # of its (first) message in the group's put
        #: A parked timer message's recall handle (the answer's ``recallHandle``), else None.
        self.recall_handle: str | None = None
        #: The duplicate window (issue 37): this send's keys (a :class:`~tidemq.broker.dedup.Sent`,
        #: told the outcome), or a :class:`~tidemq.broker.dedup.Duplicate` answered without a put.
        self.dedup: Sent | Duplicate | None = None


class PutGroup:
    """One put: the messages of one or more sends, all to one topic and queue."""

    __slots__ = ("error", "future", "msgs", "nbytes", "nsends", "replica", "result", "sends", "started")

    def __init__(self) -> None:
        self.sends: list[Send] = []  # until stored: sends point at their group, not back
        self.nsends = 0
        self.msgs: list[MessageInner] = []
        self.nbytes = 0  # request bodies coalesced so far (what GROUP_MAX_BYTES bounds)
        self.future: Future[PutResult] | None = None  # the store's answer to the put
        self.result: PutResult | None = None
        # What the store raised, as text: the exception itself would hold this frame's caller
        # through its traceback (a cycle for the collector).
        self.error: str | None = None
        self.replica: Future[ReplicaStatus] | None = None  # asked once per put
        self.started = 0.0

    def add(self, send: Send) -> None:
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
        put_halves(broker, sends)


def put_halves(broker: BrokerContext, sends: list[Send]) -> None:
    """A group the store refused for one message (nothing of it stored): each half put on its
    own, in order, halving again where refused, so the bad message ends up alone and fails by
    itself while the rest stays coalesced."""
    half = len(sends) // 2
    for part in (sends[:half], sends[half:]):
        regroup = PutGroup()
        for send in part:
            regroup.add(send)
        store_group(broker, regroup)


def store_groups(broker: BrokerContext, groups: list[PutGroup]) -> None:
    """:func:`store_group` of each of ``groups`` in order, the same puts and effects; with one
    store call for all of them where the store offers it (:class:`tidemq.store.GroupPut`: one lock
    and one write for a read's queues) and they are more than one."""
    n = len(groups)
    put_groups = group_put(broker.store) if n > 1 else None
    if put_groups is None:
        for group in groups:
            store_group(broker, group)
        return
    i = 0
    while i < n:
        if i == n - 1:  # one left: the plain put
            store_group(broker, groups[i])
            return
        rest = groups[i:] if i else groups
        started = time.perf_counter()
        try:
            futures = put_groups([group.msgs for group in rest])
        except Exception:
            # Nothing was put: the first group alone, as store_group answers a store that raises.
            store_group(broker, groups[i])
            i += 1
            continue
        if not 0 < len(futures) <= len(rest):
            raise RuntimeError(
                f"{type(broker.store).__name__}.put_message_groups put {len(futures)} of {len(rest)} groups"
            )
        last_sends: list[Send] = []
        for group, future in zip(rest, futures, strict=False):  # as store_group, for each group put
            last_sends, group.sends = group.sends, []
            group.nsends = len(last_sends)
            group.started = started
            group.future = future
        i += len(futures)
        future = futures[-1]
        if (
            len(last_sends) > 1
            and future.done()
            and future.exception() is None
            and future.result().status in _ONE_MESSAGE_STATUSES
        ):
            put_halves(broker, last_sends)  # as store_group, before the rest


def settled(broker: BrokerContext, send: Send) -> bool:
    """Fill ``send``'s outcome when its put and replicas are done already (async flush: nearly
    every send), without a coroutine; False when it has to wait (:func:`settle`)."""
    group = send.group
    if group is None:  # a duplicate (issue 37): answered from its first copy, never put
        return send.dedup.settled(broker, send)  # type: ignore[union-attr]
    unwritten = broker.topics.unwritten  # empty but a few ms after a topic's creation
    if unwritten and not unwritten.keys().isdisjoint(_topics(send)):
        return False  # settle waits for topics.json
    outcome = _put_outcome(broker, group)
    if outcome is None:
        return False
    _fill(broker, send, group, outcome)
    return True


def settled_many(broker: BrokerContext, sends: list[Send], done: list[bool]) -> None:
    """:func:`settled` of each send whose ``done`` is False, in order, ``done`` set to its answer:
    the same outcomes, with each put's futures asked and its status mapped once per put instead of
    once per send (the sends of one read share a few puts)."""
    if broker.topics.unwritten:  # a few ms after a topic's creation: send by send
        for i, send in enumerate(sends):
            if not done[i]:
                done[i] = settled(broker, send)
        return
    if _settle_sends is not None:  # the same loop compiled (tidemq._native._send_lane)
        _settle_sends(broker, sends, done, _put_outcome, _fill)
        return
    settled_many_py(broker, sends, done)


def settled_many_py(broker: BrokerContext, sends: list[Send], done: list[bool]) -> None:
    """:func:`settled_many`'s loop in Python (the reference of the compiled ``settle_sends``)."""
    outcomes: dict[PutGroup, _Outcome | None] = {}
    for i, send in enumerate(sends):
        if done[i]:
            continue
        group = send.group
        if group is None:  # a duplicate (issue 37)
            done[i] = send.dedup.settled(broker, send)  # type: ignore[union-attr]
            continue
        outcome = outcomes.get(group, _UNASKED)
        if outcome is _UNASKED:
            outcome = outcomes[group] = _put_outcome(broker, group)
        if outcome is not None:
            _fill(broker, send, group, outcome)
            done[i] = True


async def settle(broker: BrokerContext, send: Send) -> None:
    """Wait for ``send``'s put and replicas, tell the hooks, fill its outcome."""
    group = send.group
    if group is None:  # a duplicate (issue 37)
        await send.dedup.settle(broker, send)  # type: ignore[union-attr]
        return
    if group.result is None and group.error is None:
        assert group.future is not None
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
    topics = broker.topics
    problem = await topics.written(*_topics(send)) if topics.unwritten else None
    _fill(broker, send, group, _outcome(broker, group, replica))
    if problem is not None and send.status is _SUCCESS:
        # Stored, but the topic it created is not durable yet: as a flush that timed out.
        send.status, send.remark = _FLUSH_DISK_TIMEOUT, problem


def _topics(send: Send) -> tuple[str, ...]:
    """The topics a send may have created: its messages' and the one a delay or timer put aside."""
    first = send.msgs[0]
    real = first.properties.get(_REAL_TOPIC)
    return (first.topic, real) if real else (first.topic,)


def _replica_future(broker: BrokerContext, group: PutGroup, result: PutResult) -> Future[ReplicaStatus]:
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


#: A put's outcome, the same for each of its sends: status, remark, epoch.
_Outcome = tuple[Status, "str | None", "int | None"]
#: ``outcomes.get``'s default in :func:`settled_many`: the put not asked yet (None: it waits).
_UNASKED: _Outcome = (Status.SYSTEM_ERROR, "unasked", None)


def _put_outcome(broker: BrokerContext, group: PutGroup) -> _Outcome | None:
    """The put's outcome when it and its replicas answered already; None when it has to wait."""
    if group.result is None and group.error is None:
        future = group.future
        assert future is not None  # put, or the store raised (then group.error is set)
        if not future.done() or future.exception() is not None:
            return None  # settle awaits it, or logs the failure
        group.result = future.result()
    replica = None
    result = group.result
    if result is not None and result.status is _PUT_OK:
        replica_future = _replica_future(broker, group, result)
        if not replica_future.done() or replica_future.exception() is not None:
            return None
        replica = replica_future.result()
    return _outcome(broker, group, replica)


def _outcome(broker: BrokerContext, group: PutGroup, replica: ReplicaStatus | None) -> _Outcome:
    """The status, remark and epoch of a put's sends once it (and, when it succeeded, its replicas)
    answered."""
    result = group.result
    if result is None:  # the store raised
        return _SYSTEM_ERROR, f"store error: {group.error}", None
    role_aware = broker.role_aware
    epoch = role_aware.current_epoch() if role_aware is not None else None
    status = result.status
    code: Status
    remark: str | None
    if status is _PUT_OK:  # skips hashing the enum (a Python-level __hash__)
        code, remark = _SUCCESS, None
    else:
        known = _PUT_STATUSES.get(status)
        code, remark = known if known is not None else (_SYSTEM_ERROR, status.value)
    if result.error:
        remark = f"{remark or status.value}: {result.error}"
    if status is _PUT_OK:
        code = _SUCCESS if replica is _REPLICA_OK else _REPLICA_STATUSES.get(replica, _SYSTEM_ERROR)
        if code is _SYSTEM_ERROR:
            remark = f"replication answered {replica}"
        elif replica is _NOT_MASTER:
            remark = (
                f"the broker[{broker.settings.name}] is not master (fenced): the message is not acknowledged"
            )
    return code, remark, epoch


def _fill(broker: BrokerContext, send: Send, group: PutGroup, outcome: _Outcome) -> None:
    """``send``'s outcome from its put's (:func:`_outcome`): status, remark, epoch, its message id
    and queue offset; the window and the hooks told."""
    ctx = send.ctx
    result = group.result
    code, remark, epoch = outcome
    if result is None:  # the store raised
        if ctx is not None:
            ctx.status = "SYSTEM_ERROR"
            ctx.elapsed_ms = (time.perf_counter() - group.started) * 1000
            broker.hooks.tidemq_after_send(context=ctx)
        send.status, send.remark, send.epoch = code, remark, epoch
        send.msg_id, send.queue_offset = "", 0
        if send.dedup is not None:
            send.dedup.stored(send, None)  # type: ignore[union-attr]
        return
    send.epoch = epoch
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
    send.status, send.remark, send.msg_id, send.queue_offset = code, remark, msg_id, queue_offset
    dedup = send.dedup
    if dedup is not None:  # the duplicate window keeps this answer for a resend (issue 37)
        dedup.stored(send, result)  # type: ignore[union-attr]
    if ctx is not None:
        ctx.status = code.name
        ctx.msg_id = msg_id
        ctx.queue_offset = queue_offset
        ctx.elapsed_ms = (time.perf_counter() - group.started) * 1000
        broker.hooks.tidemq_after_send(context=ctx)
