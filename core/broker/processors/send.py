"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK (SendMessageProcessor)."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from tidemq.address import split_address
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import (
    DEFAULT_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    Header,
    dlq_topic,
    kv,
    retry_topic,
)
from tidemq.broker.transaction import is_half_request
from tidemq.errors import CorruptDataError
from tidemq.futures import resolved
from tidemq.message import (
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
from tidemq.replication import ReplicaStatus
from tidemq.store import PutResult, PutStatus
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
}


def send_header(request: RemotingCommand) -> Header:
    """The send header with V2's one-letter names expanded."""
    fields = request.ext_fields
    if request.code == RequestCode.SEND_MESSAGE_V2 or ("b" in fields and "topic" not in fields):
        fields = {V2_NAMES.get(k, k): v for k, v in fields.items()}
    return Header(fields, "SEND_MESSAGE")


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


class SendProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

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
            return None, request.reply(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"the broker[{b.settings.name}] is a slave and takes no messages",
            )
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # %RETRY%<group>: the group's rules apply
            problem = check_group_name(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
        else:
            problem = check_topic_name(topic)
        if problem:
            return None, request.reply(ResponseCode.SYSTEM_ERROR, problem)
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

    # ------------------------------------------------------------------ SEND_MESSAGE / V2
    async def send_message(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = send_header(request)
        if h.bool("batch"):  # RocketMQ dispatches on the header's batch flag, whatever the code
            return await self.send_batch(conn, request)
        group = h.str("producerGroup", "")
        topic = h.str("topic")
        queue_id = h.int("queueId", -1)
        sys_flag = h.int("sysFlag", 0)
        cfg, error = self._check_topic(
            request,
            topic,
            h.str("defaultTopic", DEFAULT_TOPIC),
            h.int("defaultTopicQueueNums", 4),
            queue_id,
            sys_flag,
        )
        if error is not None:
            return error
        if queue_id < 0:
            queue_id = random.randrange(max(cfg.write_queue_nums, 1))
        properties = string_to_properties(h.str("properties", ""))
        reconsume_times = h.int("reconsumeTimes", 0)
        body = request.payload()
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            routed = self._route_retry(
                request, topic, queue_id, reconsume_times, h.int("maxReconsumeTimes", -1), properties
            )
            if isinstance(routed, RemotingCommand):
                return routed
            topic, queue_id = routed
        msg = MessageInner(
            topic=topic,
            body=body,
            queue_id=queue_id,
            flag=h.int("flag", 0),
            properties=properties,
            sys_flag=sys_flag,
            born_timestamp=h.int("bornTimestamp", 0),
            born_host=born_host(conn),
            store_host=b.store_host,
            reconsume_times=reconsume_times,
        )
        return await self._put(conn, request, group, [msg], batch=False, special=True)

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

    # ------------------------------------------------------------------ SEND_BATCH_MESSAGE
    async def send_batch(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = send_header(request)
        group = h.str("producerGroup", "")
        topic = h.str("topic")
        queue_id = h.int("queueId", -1)
        sys_flag = h.int("sysFlag", 0)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return request.reply(
                ResponseCode.MESSAGE_ILLEGAL, "batch request does not support retry group " + topic
            )
        cfg, error = self._check_topic(
            request,
            topic,
            h.str("defaultTopic", DEFAULT_TOPIC),
            h.int("defaultTopicQueueNums", 4),
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
                h.int("bornTimestamp", 0),
                born_host(conn),
                b.store_host,
                h.int("reconsumeTimes", 0),
            )
        except BatchLimitError as exc:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, f"{exc} (max_batch_messages)")
        except CorruptDataError as exc:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, f"malformed batch body: {exc}")
        if not msgs:
            return request.reply(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
        return await self._put(conn, request, group, msgs, batch=True)

    # ------------------------------------------------------------------ store + hooks
    async def _put(
        self,
        conn: Connection,
        request: RemotingCommand,
        group: str,
        msgs: list[MessageInner],
        *,
        batch: bool,
        special: bool = False,
    ) -> RemotingCommand:
        b = self.broker
        first = msgs[0]
        reply_queue_id = first.queue_id
        hooks = b.hooks
        # A context and two hook calls per send cost ~5 % of a send: build them only when a plugin
        # listens (checked per send, so a plugin registered at run time is seen at once).
        ctx: SendContext | None = None
        if hooks.tidemq_before_send.get_hookimpls() or hooks.tidemq_after_send.get_hookimpls():
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
        if special:
            # Issue 10: a transaction's half message goes to RMQ_SYS_TRANS_HALF_TOPIC, a delayed one
            # to SCHEDULE_TOPIC_XXXX (after the hooks, so they judge the topic the producer named).
            if is_half_request(first.properties, first.sys_flag):
                b.transactions.to_half(first)
            else:
                b.schedule.rewrite(first)
        start = time.perf_counter()
        try:
            future = b.store.put_messages(msgs) if batch else b.store.put_message(first)
            result: PutResult = await resolved(future)
        except Exception as exc:
            log.exception("store refused a message for %s", first.topic)
            if ctx is not None:
                ctx.status, ctx.elapsed_ms = "SYSTEM_ERROR", (time.perf_counter() - start) * 1000
                hooks.tidemq_after_send(context=ctx)
            return request.reply(ResponseCode.SYSTEM_ERROR, f"store error: {exc}")
        code, remark = _PUT_CODES.get(result.status, (ResponseCode.SYSTEM_ERROR, result.status.value))
        if result.error:
            remark = f"{remark or result.status.value}: {result.error}"
        if result.ok:
            b.stats.on_put(result.message_count or len(msgs), result.wrote_bytes)
            replica = await resolved(
                b.replication.wait_for_replicas(result.wrote_offset + result.wrote_bytes)
            )
            code = _REPLICA_CODES.get(replica, ResponseCode.SYSTEM_ERROR)
            if code == ResponseCode.SYSTEM_ERROR:
                remark = f"replication answered {replica}"
        if ctx is not None:
            ctx.status = ResponseCode(code).name
            ctx.msg_id = result.msg_id
            ctx.queue_offset = result.queue_offset
            ctx.elapsed_ms = (time.perf_counter() - start) * 1000
            hooks.tidemq_after_send(context=ctx)
        if result.status is not PutStatus.PUT_OK and code in (ResponseCode.SUCCESS,):
            code = ResponseCode.SYSTEM_ERROR
        fields = None
        if code in (
            ResponseCode.SUCCESS,
            ResponseCode.FLUSH_DISK_TIMEOUT,
            ResponseCode.FLUSH_SLAVE_TIMEOUT,
            ResponseCode.SLAVE_NOT_AVAILABLE,
        ):
            fields = kv(
                msgId=result.msg_id,
                queueId=reply_queue_id,
                queueOffset=result.queue_offset,
                MSG_REGION=first.properties.get(Prop.MSG_REGION, "DefaultRegion"),
                TRACE_ON=first.properties.get(Prop.TRACE_SWITCH, "true"),
            )
        return request.reply(code, remark, fields)

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
        b.stats.on_put(1, result.wrote_bytes)
        return request.reply(ResponseCode.SUCCESS)


def register(register: ProcessorRegister) -> None:
    p = SendProcessor(register.context)
    register.add(RequestCode.SEND_MESSAGE, p.send_message)
    register.add(RequestCode.SEND_MESSAGE_V2, p.send_message)
    register.add(RequestCode.SEND_BATCH_MESSAGE, p.send_batch)
    register.add(RequestCode.CONSUMER_SEND_MSG_BACK, p.consumer_send_back)
