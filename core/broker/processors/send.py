"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK (SendMessageProcessor).

A send goes through three steps.  :meth:`SendProcessor._prepare` does everything before the
store, synchronously: header, topic checks, retry routing, the ``tidemq_before_send`` hook and the
transaction/delay rewrite.  :func:`~tidemq.broker.processors.send_put.store_group` puts a group of
messages; :func:`~tidemq.broker.processors.send_put.finish` waits for the put and the replicas,
calls ``tidemq_after_send`` and builds the response.

Request coalescing: the sends of one read reach :meth:`SendHandler.many` together.  Each is
prepared on its own, in order (its own checks, hooks and error), then the messages are stored one
put per topic, queue and transaction type (one lock, one append, one consume-queue write), and each
request is answered with its own message id and queue offset.  A put the store refuses for one bad
message (too large, properties too long) refuses it whole, atomically: the group is then put in
halves, in order, halving again where refused, so that message fails alone.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidemq.address import split_address
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import (
    DEFAULT_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    Header,
    dlq_topic,
    field_bool,
    field_int,
    field_str,
    retry_topic,
)
from tidemq.broker.processors.send_put import (
    GROUP_MAX_BYTES,
    PendingSend,
    PutGroup,
    answer_now,
    finish,
    store_group,
)
from tidemq.broker.timer import TimerRefused
from tidemq.broker.transaction import is_half_request
from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.message import (
    TRANSACTION_TYPE_MASK,
    BatchLimitError,
    MessageInner,
    Prop,
    decode_batch_messages,
    decode_message,
    string_to_properties,
)
from tidemq.names import check_group_name, check_topic_name
from tidemq.observe import SendContext
from tidemq.perm import PERM_READ, PERM_WRITE, is_writeable
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)

# SendMessageRequestHeaderV2 names its fields a..m to keep the header small.
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}
_V2_SHORT = frozenset(V2_NAMES)
_V2_BY_LONG = {long: short for short, long in V2_NAMES.items()}
#: The send header's fields, in the order a send reads them (which error a bad header gets).
_FIELDS = (
    "batch",
    "producerGroup",
    "topic",
    "queueId",
    "sysFlag",
    "defaultTopic",
    "defaultTopicQueueNums",
    "properties",
    "reconsumeTimes",
    "maxReconsumeTimes",
    "flag",
    "bornTimestamp",
)
_V2_FIELDS = tuple(_V2_BY_LONG[name] for name in _FIELDS)
_WHAT = "SEND_MESSAGE"
#: ``failed(request, exc)``: the answer to a request whose handling raised ``exc``.
Failed = Callable[[RemotingCommand, Exception], RemotingCommand]
# Enum members as globals: an enum class attribute costs ~0.2 us a lookup.
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)
_CLUSTER = Prop.CLUSTER

#: Topic names known to pass the name rules; a pure function of the name, so cached (bounded).
_NAME_CACHE_MAX = 4096


def send_fields(request: RemotingCommand) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The send header's fields and the keys to read :data:`_FIELDS` by.

    V2's one-letter names are read as they are, without a renamed copy per send; a header that
    mixes in other names gets the renamed copy (of two names for one field, the later one wins).
    """
    fields = request.ext_fields
    if request.code == _SEND_MESSAGE_V2 or ("b" in fields and "topic" not in fields):
        if fields.keys() <= _V2_SHORT:
            return fields, _V2_FIELDS
        fields = {V2_NAMES.get(k, k): v for k, v in fields.items()}
    return fields, _FIELDS


def parse_host(address: str) -> tuple[str, int]:
    """A peer's ``host:port`` as BORNHOST; ``("127.0.0.1", 0)`` when it is not one."""
    try:
        host, port = split_address(address or "")
    except ValueError:
        return "127.0.0.1", 0
    return host or "127.0.0.1", port


def born_host(conn: Connection) -> tuple[str, int]:
    """The producer's address, parsed once per connection (it is the same for every send)."""
    context = getattr(conn, "context", None)
    if context is None:
        return parse_host(conn.remote_address)
    host = context.get("born_host")
    if host is None:
        host = context["born_host"] = parse_host(conn.remote_address)
    return host


def _listened(hook: Any) -> bool:
    """Whether a plugin implements ``hook``.

    pluggy's ``get_hookimpls()`` copies its list on every call; the list it keeps (and changes in
    place as plugins come and go) is read instead where this pluggy has it.
    """
    impls = getattr(hook, "_hookimpls", None)
    if type(impls) is list:
        return bool(impls)
    return bool(hook.get_hookimpls())


def _prepare_or_fail(
    processor: SendProcessor, conn: Connection, request: RemotingCommand, failed: Failed
) -> PendingSend | RemotingCommand:
    """``_prepare``, or ``failed``'s answer to what it raised (a bad header).

    The exception is answered here and dropped: kept in a list of the caller it would hold the
    caller's frame through its traceback, and the frame the list (a cycle per bad request).
    """
    try:
        return processor._prepare(conn, request)
    except Exception as exc:
        return failed(request, exc)


class SendHandler:
    """The handler of the send codes: one request (``__call__``) or the sends of one read (``many``)."""

    __slots__ = ("_processor",)

    def __init__(self, processor: SendProcessor) -> None:
        self._processor = processor

    def __call__(self, conn: Connection, request: RemotingCommand) -> Awaitable[RemotingCommand]:
        return self._processor.send_message(conn, request)

    def many(
        self, conn: Connection, requests: list[RemotingCommand], failed: Failed
    ) -> list[RemotingCommand | Awaitable[RemotingCommand]]:
        """Prepare and store the sends of one read now; per request, in order, its response or an
        awaitable of it.  ``failed(request, exc)`` answers a request whose handling raised ``exc``
        (the broker's answer to a handler's exception).

        Messages are grouped per (topic, queue, transaction type) of the final destination, in
        request order; a batch send's messages stay together, in its place among them.
        """
        p = self._processor
        prepared: list[PendingSend | RemotingCommand] = []
        groups: dict[tuple[str, int, int], PutGroup] = {}
        for request in requests:
            send = _prepare_or_fail(p, conn, request, failed)  # a bad header fails this request alone
            prepared.append(send)
            if type(send) is not PendingSend:
                continue
            first = send.msgs[0]
            key = (first.topic, first.queue_id, first.sys_flag & TRANSACTION_TYPE_MASK)
            group = groups.get(key)
            if group is None:
                group = groups[key] = PutGroup()
            group.add(send)
            body = request.body
            group.nbytes += len(body) if body else 0
            if group.nbytes >= GROUP_MAX_BYTES:
                del groups[key]
                store_group(p.broker, group)
        for group in groups.values():
            store_group(p.broker, group)
        out: list[RemotingCommand | Awaitable[RemotingCommand]] = []
        for item in prepared:
            if isinstance(item, PendingSend):
                response = answer_now(p.broker, item)
                out.append(finish(p.broker, item) if response is None else response)
            else:
                out.append(item)
        return out


class SendProcessor:
    """Stores what producers send (SendMessageProcessor); see the module docstring for the steps."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self.handler = SendHandler(self)
        self._valid_topics: set[str] = set()

    # ------------------------------------------------------------------ checks
    def _check_topic(
        self,
        request: RemotingCommand,
        topic: str,
        default_topic: str,
        default_queue_nums: int,
        queue_id: int,
        sys_flag: int,
    ) -> tuple[Any, RemotingCommand | None]:
        """The topic config to write to, or the error response (msgCheck of RocketMQ)."""
        b = self.broker
        if not b.is_master:
            # Controller mode: the epoch this replica follows, as on every send answer.
            role_aware = b.role_aware
            return None, request.reply(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"the broker[{b.settings.name}] is a slave and takes no messages",
                {"epoch": str(role_aware.current_epoch())} if role_aware is not None else None,
            )
        if topic not in self._valid_topics:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # %RETRY%<group>: the group's rules apply
                problem = check_group_name(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
            else:
                problem = check_topic_name(topic)
            if problem:
                return None, request.reply(ResponseCode.SYSTEM_ERROR, problem)
            if len(self._valid_topics) >= _NAME_CACHE_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic == DEFAULT_TOPIC:
            return None, request.reply(
                ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is conflict with system reserved words."
            )
        cfg = b.topics.get(topic)
        if cfg is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                group_cfg = b.groups.find_or_create(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
                if group_cfg is not None:
                    cfg = b.topics.create_in_send_back(
                        topic, group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE, sys_flag
                    )
            else:
                cfg = b.topics.create_in_send(
                    topic, default_topic or DEFAULT_TOPIC, default_queue_nums, sys_flag
                )
        if cfg is None:
            return None, request.reply(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not is_writeable(cfg.perm):
            return None, request.reply(
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] sending message is forbidden (perm {cfg.perm})",
            )
        if queue_id >= cfg.queue_count:
            return None, request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {topic} has {cfg.write_queue_nums} write queues",
            )
        return cfg, None

    # ------------------------------------------------------------------ SEND_MESSAGE / V2 / BATCH
    async def send_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """One send request of any of the three codes, on its own."""
        send = self._prepare(conn, request)
        if not isinstance(send, PendingSend):
            return send
        group = PutGroup()
        group.add(send)
        store_group(self.broker, group)
        response = answer_now(self.broker, send)
        return response if response is not None else await finish(self.broker, send)

    send_batch = send_message  # the header's batch flag and the code choose; one entry point

    def _prepare(self, conn: Connection, request: RemotingCommand) -> PendingSend | RemotingCommand:
        """Everything before the store: the send to store, or the response that ends it here."""
        fields, keys = send_fields(request)
        get = fields.get
        # RocketMQ dispatches on the header's batch flag, whatever the code.
        if request.code == _SEND_BATCH_MESSAGE or field_bool(get(keys[0])):
            return self._prepare_batch(conn, request, fields, keys)
        b = self.broker
        group = field_str(get(keys[1]), "producerGroup", _WHAT, "")
        topic = field_str(get(keys[2]), "topic", _WHAT)
        queue_id = field_int(get(keys[3]), "queueId", _WHAT, -1)
        sys_flag = field_int(get(keys[4]), "sysFlag", _WHAT, 0)
        cfg, error = self._check_topic(
            request,
            topic,
            field_str(get(keys[5]), "defaultTopic", _WHAT, DEFAULT_TOPIC),
            field_int(get(keys[6]), "defaultTopicQueueNums", _WHAT, 4),
            queue_id,
            sys_flag,
        )
        if error is not None:
            return error
        if queue_id < 0:
            queue_id = random.randrange(max(cfg.write_queue_nums, 1))
        properties = string_to_properties(field_str(get(keys[7]), "properties", _WHAT, ""))
        # As RocketMQ 4.6+: a stored message names its cluster (a request's responder replies to
        # <CLUSTER>_REPLY_TOPIC through it).
        properties[_CLUSTER] = b.settings.cluster
        reconsume_times = field_int(get(keys[8]), "reconsumeTimes", _WHAT, 0)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            routed = self._route_retry(
                request,
                topic,
                queue_id,
                reconsume_times,
                field_int(get(keys[9]), "maxReconsumeTimes", _WHAT, -1),
                properties,
            )
            if isinstance(routed, RemotingCommand):
                return routed
            topic, queue_id = routed
        msg = MessageInner(
            topic,
            request.payload(),
            queue_id,
            field_int(get(keys[10]), "flag", _WHAT, 0),
            properties,
            sys_flag,
            field_int(get(keys[11]), "bornTimestamp", _WHAT, 0),
            born_host(conn),
            b.store_host,
            reconsume_times,
        )
        send = self._hooked(conn, request, group, [msg], False)
        if type(send) is PendingSend:
            try:  # a timer (TIMER_* properties) parks it in rmq_sys_wheel_timer; a half's is checked
                b.timers.rewrite(msg)
            except TimerRefused as exc:
                return request.reply(exc.code, exc.remark)
            # A transaction's half message goes to RMQ_SYS_TRANS_HALF_TOPIC, a delayed one to
            # SCHEDULE_TOPIC_XXXX: after the hooks, so they judge the topic the producer named.
            if is_half_request(properties, sys_flag):
                b.transactions.to_half(msg)
            elif Prop.DELAY_TIME_LEVEL in properties:  # what rewrite acts on
                b.schedule.rewrite(msg)
        return send

    def _route_retry(
        self,
        request: RemotingCommand,
        topic: str,
        queue_id: int,
        reconsume_times: int,
        max_reconsume: int,
        properties: dict[str, str],
    ) -> tuple[str, int] | RemotingCommand:
        """A message re-sent to a retry topic goes to the DLQ once it used up its retries."""
        b = self.broker
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return request.reply(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
            )
        limit = max_reconsume if max_reconsume >= 0 else group_cfg.retry_max_times
        if reconsume_times >= limit:
            dlq = dlq_topic(group)
            b.topics.create_in_send_back(dlq, 1, PERM_WRITE)
            properties.pop(Prop.DELAY_TIME_LEVEL, None)
            return dlq, 0
        return topic, queue_id

    def _prepare_batch(
        self, conn: Connection, request: RemotingCommand, fields: Mapping[str, Any], keys: tuple[str, ...]
    ) -> PendingSend | RemotingCommand:
        """SEND_BATCH_MESSAGE: the batch body's messages, stored by one put."""
        b = self.broker
        get = fields.get
        group = field_str(get(keys[1]), "producerGroup", _WHAT, "")
        topic = field_str(get(keys[2]), "topic", _WHAT)
        queue_id = field_int(get(keys[3]), "queueId", _WHAT, -1)
        sys_flag = field_int(get(keys[4]), "sysFlag", _WHAT, 0)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return request.reply(
                ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group " + topic
            )
        cfg, error = self._check_topic(
            request,
            topic,
            field_str(get(keys[5]), "defaultTopic", _WHAT, DEFAULT_TOPIC),
            field_int(get(keys[6]), "defaultTopicQueueNums", _WHAT, 4),
            queue_id,
            sys_flag,
        )
        if error is not None:
            return error
        if queue_id < 0:
            queue_id = random.randrange(max(cfg.write_queue_nums, 1))
        try:
            msgs = decode_batch_messages(
                request.payload(),
                b.settings.max_batch_messages,
                topic,
                queue_id,
                sys_flag,
                field_int(get(keys[11]), "bornTimestamp", _WHAT, 0),
                born_host(conn),
                b.store_host,
                field_int(get(keys[8]), "reconsumeTimes", _WHAT, 0),
            )
        except BatchLimitError as exc:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, f"{exc} (max_batch_messages)")
        except CorruptDataError as exc:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, f"malformed batch body: {exc}")
        if not msgs:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
        send = self._hooked(conn, request, group, msgs, True)
        try:  # a timer on any message parks the batch in rmq_sys_wheel_timer, each until its time
            if type(send) is PendingSend:
                b.timers.rewrite_batch(msgs)
        except TimerRefused as exc:
            return request.reply(exc.code, exc.remark)
        return send

    # ------------------------------------------------------------------ hooks, store, answer
    def _hooked(
        self, conn: Connection, request: RemotingCommand, group: str, msgs: list[MessageInner], batch: bool
    ) -> PendingSend | RemotingCommand:
        """``tidemq_before_send`` for one send: the send, or the response to its veto."""
        b = self.broker
        first = msgs[0]
        hooks = b.hooks
        # A context and two hook calls per send cost ~5 % of a send: build them only when a plugin
        # listens (checked per send, so a plugin registered at run time is seen at once).
        ctx: SendContext | None = None
        if _listened(hooks.tidemq_before_send) or _listened(hooks.tidemq_after_send):
            ctx = SendContext(
                producer_group=group,
                topic=first.topic,
                queue_id=first.queue_id,
                properties=first.properties,
                body_size=sum(len(m.body) for m in msgs),
                client_address=conn.remote_address,
                broker_address=b.address,
            )
            if batch:
                ctx.extra["batch_size"] = len(msgs)
            veto = hooks.tidemq_before_send(context=ctx)
            if veto is not None:
                ctx.status = "NO_PERMISSION"
                hooks.tidemq_after_send(context=ctx)
                return request.reply(ResponseCode.NO_PERMISSION, str(veto))
        return PendingSend(request, group, msgs, batch, ctx, first.queue_id)

    # ------------------------------------------------------------------ CONSUMER_SEND_MSG_BACK
    async def consumer_send_back(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """A consumer failed a message: store a copy in %RETRY%group (or %DLQ%group when exhausted).

        The copy carries the DELAY property with a level that grows with each retry, as RocketMQ
        does; the schedule service delivers it when that level's delay has passed.
        """
        b = self.broker
        h = Header(request.ext_fields, "CONSUMER_SEND_MSG_BACK")
        group = h.str("group")
        problem = check_group_name(group)
        if problem:  # the group names the retry and dead-letter topics (and their directories)
            return request.reply(ResponseCode.SYSTEM_ERROR, problem)
        offset = h.int("offset")
        delay_level = h.int("delayLevel", 0)
        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return request.reply(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
            )
        if group_cfg.retry_queue_nums <= 0:
            return request.reply(ResponseCode.SUCCESS)
        raw = b.store.look_message_by_offset(offset)
        if raw is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
        try:
            ext = decode_message(raw)
        except CorruptDataError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}: {exc}")
        props = dict(ext.properties)
        props.setdefault(Prop.RETRY_TOPIC, ext.topic)
        props.pop(Prop.WAIT_STORE_MSG_OK, None)
        max_reconsume = h.int("maxReconsumeTimes", -1)
        if max_reconsume < 0:
            max_reconsume = group_cfg.retry_max_times
        if ext.reconsume_times >= max_reconsume or delay_level < 0:
            topic = dlq_topic(group)
            b.topics.create_in_send_back(topic, 1, PERM_WRITE)
            queue_id = 0
            props.pop(Prop.DELAY_TIME_LEVEL, None)
        else:
            topic = retry_topic(group)
            cfg = b.topics.create_in_send_back(topic, group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE)
            queue_id = random.randrange(max(cfg.write_queue_nums, 1))
            if delay_level == 0:
                delay_level = 3 + ext.reconsume_times
            props[Prop.DELAY_TIME_LEVEL] = str(delay_level)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID, h.str("originMsgId", "") or ext.uniq_key or ext.msg_id)
        msg = MessageInner(
            topic=topic,
            body=ext.body,
            queue_id=queue_id,
            flag=ext.flag,
            properties=props,
            sys_flag=ext.sys_flag,
            born_timestamp=ext.born_timestamp,
            born_host=ext.born_host,
            store_host=b.store_host,
            reconsume_times=ext.reconsume_times + 1,
        )
        b.schedule.rewrite(msg)  # retries wait in the delay levels (issue 10)
        result = await resolved(b.store.put_message(msg))
        if not result.ok:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"{result.status.value} {result.error}".strip())
        b.stats.on_put(msg.topic, 1, result.wrote_bytes)
        return request.reply(ResponseCode.SUCCESS)


def register(register: ProcessorRegister) -> None:
    p = SendProcessor(register.context)
    # One handler object for the three send codes: a read's sends of any of them are coalesced
    # (a plugin that wraps one of the codes takes it out of coalescing, and its wrapper still runs).
    register.add(RequestCode.SEND_MESSAGE, p.handler)
    register.add(RequestCode.SEND_MESSAGE_V2, p.handler)
    register.add(RequestCode.SEND_BATCH_MESSAGE, p.handler)
    register.add(RequestCode.CONSUMER_SEND_MSG_BACK, p.consumer_send_back)
