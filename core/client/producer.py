"""The producer (RocketMQ's DefaultMQProducerImpl): route lookup, queue selection, retries.

A send picks a queue through the ``select`` plugin (default ``latency_fault``), sends it to that
queue's master broker and, when the attempt fails, tries again up to ``retry_times`` more times
while avoiding the broker that just failed; the selector learns every attempt's latency so slow
or dead brokers stay out of rotation for a while.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tidemq.client import request_reply
from tidemq.client.compression import compress
from tidemq.client.errors import BrokerError, ClientError, NoRouteError, SendFailedError, SendRefusedError
from tidemq.client.instance import ClientInstance
from tidemq.client.message import Message, SendResult, SendStatus, new_message_id
from tidemq.client.route import AUTO_CREATE_TOPIC
from tidemq.errors import MessageTooLargeError
from tidemq.message import BatchItem, MessageExt, Prop, encode_batch, java_string_hash, properties_to_string
from tidemq.observe import SendContext
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingError
from tidemq.trace.hooks import Tracer, make_tracer

log = logging.getLogger(__name__)

#: Broker answers worth another attempt on another broker (RocketMQ's retryResponseCodes).
RETRY_CODES = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.NO_PERMISSION,
    }
)
_STATUS: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

#: ``selector(queues, message, arg) -> queue`` for ordered sends (RocketMQ's MessageQueueSelector).
MessageQueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]


def select_by_hash(queues: Sequence[MessageQueue], msg: Message, key: Any) -> MessageQueue:
    """Same sharding key -> same queue (Java ``abs(key.hashCode()) % size``)."""
    return queues[abs(java_string_hash(str(key))) % len(queues)]


class Producer:
    """An asyncio producer.  Use ``async with Producer("group", namesrv="127.0.0.1:9876") as p``."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        selector: str = "latency_fault",
        selector_options: dict[str, Any] | None = None,
        send_timeout: float = 3.0,
        retry_times: int = 2,
        retry_another_broker_when_not_store_ok: bool = False,
        max_message_size: int = 4 * 1024 * 1024,
        compress_over: int = 4 * 1024,
        compression: str = "zlib",
        compression_level: int = 5,
        default_topic_queues: int = 4,
        instance: ClientInstance | None = None,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        trace_queue_size: int = 2048,
        **instance_options: Any,
    ) -> None:
        if not group:
            raise ClientError("producer group must not be empty")
        if retry_times < 0:
            raise ClientError(f"retry_times = {retry_times} must be >= 0")
        if compression not in ("zlib", "lz4", "zstd"):
            raise ClientError(f"compression = {compression!r} is not supported; choices: zlib, lz4, zstd")
        self.group = group
        self.instance = instance or ClientInstance(namesrv, **instance_options)
        self.manager = self.instance.manager
        self.selector = self.manager.create("select", selector, options=selector_options)
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        self.max_message_size = max_message_size
        self.compress_over = compress_over
        self.compression = compression
        self.compression_level = compression_level
        self.default_topic_queues = default_topic_queues
        self._publish: dict[str, list[MessageQueue]] = {}
        self._pending: set[asyncio.Task[Any]] = set()
        self._started = False
        #: Message trace (docs/trace.md): ``None`` unless ``enable_msg_trace``.
        self.tracer: Tracer | None = make_tracer(
            group, "PRODUCE", self.instance, enable_msg_trace, trace_topic, trace_queue_size
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._started:
            return
        await self.instance.start()
        self.instance.register_producer(self)
        if self.tracer is not None:
            await self.tracer.start()
        self._started = True

    async def shutdown(self) -> None:
        """Wait for async sends in flight, unregister from the brokers and stop."""
        if not self._started:
            return
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.tracer is not None:
            await self.tracer.shutdown()
        self._started = False
        self.instance.unregister(self)
        await self.instance.unregister_everywhere(producer_group=self.group)
        await self.instance.stop()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ member protocol
    def heartbeat_data(self) -> dict[str, Any]:
        return {"groupName": self.group}

    def topics(self) -> set[str]:
        return set(self._publish)

    # ------------------------------------------------------------------ routes
    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues of ``topic``; for an unknown topic, the auto-create (TBW102) route's brokers."""
        if not self._started:
            raise ClientError("producer is not started; call 'await producer.start()' first")
        route = await self.instance.get_route(topic)
        queues = route.publish_queues() if route is not None else []
        if not queues:
            default = await self.instance.get_route(AUTO_CREATE_TOPIC)
            if default is not None:
                queues = default.publish_queues(topic, max_queues=self.default_topic_queues)
        if not queues:
            raise NoRouteError(f"no route for topic {topic!r}: the NameServers know no writable queue for it")
        self._publish[topic] = queues
        return queues

    # ------------------------------------------------------------------ building requests
    def _check(self, msg: Message) -> None:
        if not isinstance(msg, Message):
            raise ClientError(f"expected a tidemq.client.Message, got {type(msg).__name__}")
        if len(msg.topic.encode()) > 127:
            raise ClientError(f"topic {msg.topic[:40]!r}... is longer than 127 bytes")
        if not msg.body:
            raise ClientError("message body must not be empty")

    def _prepare(self, msg: Message) -> tuple[bytes, int, dict[str, str]]:
        """Body (compressed when large), sysFlag and wire properties (with a fresh UNIQ_KEY)."""
        self._check(msg)
        props = msg.wire_properties()
        props.setdefault(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, new_message_id())
        body, sys_flag = bytes(msg.body), 0
        if len(body) > self.compress_over:
            packed, flags = compress(body, self.compression, self.compression_level)
            if len(packed) < len(body):
                body, sys_flag = packed, flags
        if len(body) > self.max_message_size:
            raise MessageTooLargeError(
                f"message body is {len(body)} bytes{' after compression' if sys_flag else ''}, "
                f"over the limit of {self.max_message_size}"
            )
        return body, sys_flag, props

    def _header(
        self, topic: str, mq: MessageQueue, sys_flag: int, props: dict[str, str], flag: int = 0
    ) -> dict[str, Any]:
        return {
            "producerGroup": self.group,
            "topic": topic,
            "defaultTopic": AUTO_CREATE_TOPIC,
            "defaultTopicQueueNums": self.default_topic_queues,
            "queueId": mq.queue_id,
            "sysFlag": sys_flag,
            "bornTimestamp": int(time.time() * 1000),
            "flag": flag,
            "properties": properties_to_string(props),
            "reconsumeTimes": 0,
            "unitMode": False,
        }

    # ------------------------------------------------------------------ sending
    async def _attempt(
        self,
        mq: MessageQueue,
        header: dict[str, Any],
        body: bytes,
        uniq_id: str,
        *,
        batch: bool,
        oneway: bool,
        timeout: float,
        props: dict[str, str],
    ) -> SendResult | None:
        addr = self.instance.broker_address(mq.broker_name)
        if addr is None:
            await self.instance.get_route(mq.topic, refresh=True)
            addr = self.instance.broker_address(mq.broker_name)
            if addr is None:
                raise ClientError(f"broker {mq.broker_name} has no master address")
        ctx = SendContext(
            side="client",
            producer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            properties=props,
            body_size=len(body),
            client_address=self.instance.client_id,
            broker_address=addr,
        )
        reason = self.manager.hook.tidemq_before_send(context=ctx)
        if reason is not None:
            raise SendRefusedError(f"send refused by a plugin: {reason}")
        header["properties"] = properties_to_string(props)
        begin = time.monotonic()
        try:
            resp = await self.instance.require_api().send(
                addr, header, body, batch=batch, oneway=oneway, timeout=timeout
            )
            result = None if resp is None else self._result(resp, mq, uniq_id, addr)
        except BaseException as exc:
            ctx.status, ctx.elapsed_ms = f"FAILED: {exc}", (time.monotonic() - begin) * 1000
            self.manager.hook.tidemq_after_send(context=ctx)
            raise
        ctx.elapsed_ms = (time.monotonic() - begin) * 1000
        if result is not None:
            ctx.status, ctx.msg_id, ctx.queue_offset = result.status.value, result.msg_id, result.queue_offset
        else:
            ctx.status = "ONEWAY"
        self.manager.hook.tidemq_after_send(context=ctx)
        if self.tracer is not None:
            self.tracer.pub(mq.topic, props, len(body), addr, begin, result, batch)
        return result

    def _result(self, resp: RemotingCommand, mq: MessageQueue, uniq_id: str, addr: str) -> SendResult:
        status = _STATUS.get(resp.code)
        if status is None:
            raise BrokerError(resp.code, resp.remark, addr)
        fields = resp.ext_fields or {}
        return SendResult(
            status=status,
            msg_id=uniq_id,
            offset_msg_id=fields.get("msgId", ""),
            queue=MessageQueue(mq.topic, mq.broker_name, int(fields.get("queueId", mq.queue_id))),
            queue_offset=int(fields.get("queueOffset", -1)),
            region_id=fields.get("MSG_REGION", ""),
            broker_address=addr,
        )

    async def _send_with_retries(
        self,
        topic: str,
        body: bytes,
        sys_flag: int,
        props: dict[str, str],
        uniq_id: str,
        flag: int,
        *,
        batch: bool,
        timeout: float | None,
        attempts: int,
        oneway: bool = False,
    ) -> SendResult | None:
        timeout = self.send_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        queues = await self.publish_queues(topic)
        errors: list[BaseException] = []
        last_broker: str | None = None
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append(TimeoutError(f"send timeout of {timeout:.3f}s used up"))
                break
            mq = self.selector.select(topic, queues, last_broker)
            header = self._header(topic, mq, sys_flag, props, flag)
            begin = time.monotonic()
            try:
                result = await self._attempt(
                    mq, header, body, uniq_id, batch=batch, oneway=oneway, timeout=remaining, props=props
                )
            except SendRefusedError:
                raise
            except (RemotingError, BrokerError, ClientError, OSError) as exc:
                latency = (time.monotonic() - begin) * 1000
                self.selector.record(mq.broker_name, latency, True)
                errors.append(exc)
                last_broker = mq.broker_name
                if isinstance(exc, BrokerError) and exc.code not in RETRY_CODES:
                    raise
                log.info("send to %s failed (attempt %d/%d): %s", mq.broker_name, attempt + 1, attempts, exc)
                continue
            self.selector.record(mq.broker_name, (time.monotonic() - begin) * 1000, False)
            if (
                result is not None
                and result.status is not SendStatus.SEND_OK
                and self.retry_another_broker_when_not_store_ok
            ):
                last_broker = mq.broker_name
                if attempt + 1 < attempts:
                    continue
            return result
        raise SendFailedError(
            f"send to topic {topic!r} failed after {len(errors)} attempt(s): {errors[-1] if errors else 'no attempt'}",
            errors,
        )

    async def send(self, msg: Message, timeout: float | None = None) -> SendResult:
        """Send and wait for the broker's answer, retrying on another broker when an attempt fails."""
        body, sys_flag, props = self._prepare(msg)
        result = await self._send_with_retries(
            msg.topic,
            body,
            sys_flag,
            props,
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
            msg.flag,
            batch=False,
            timeout=timeout,
            attempts=1 + self.retry_times,
        )
        assert result is not None
        return result

    def send_async(
        self,
        msg: Message,
        callback: Callable[[SendResult | None, BaseException | None], Any] | None = None,
        timeout: float | None = None,
    ) -> asyncio.Task[SendResult]:
        """Start a send in the background; ``callback(result, error)`` runs when it completes."""

        async def run() -> SendResult:
            try:
                result = await self.send(msg, timeout)
            except Exception as exc:
                if callback is not None:
                    callback(None, exc)
                raise
            if callback is not None:
                callback(result, None)
            return result

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if callback is not None:  # the callback saw the error; do not warn "exception never retrieved"
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def send_oneway(self, msg: Message) -> None:
        """Send without waiting for an answer: one attempt, no result."""
        body, sys_flag, props = self._prepare(msg)
        await self._send_with_retries(
            msg.topic,
            body,
            sys_flag,
            props,
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
            msg.flag,
            batch=False,
            timeout=None,
            attempts=1,
            oneway=True,
        )

    def _batch(self, msgs: Sequence[Message]) -> tuple[str, bytes, dict[str, str], str]:
        """Topic, SEND_BATCH_MESSAGE body, request properties and joined msg ids of ``msgs``."""
        if not msgs:
            raise ClientError("a batch needs at least one message")
        topic = msgs[0].topic
        items: list[BatchItem] = []
        ids: list[str] = []
        for m in msgs:
            self._check(m)
            if m.topic != topic:
                raise ClientError(f"a batch must hold one topic; got {topic!r} and {m.topic!r}")
            if m.delay_level > 0:
                raise ClientError("delayed messages cannot be sent in a batch")
            props = m.wire_properties()
            props.setdefault(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, new_message_id())
            ids.append(props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX])
            items.append(BatchItem(bytes(m.body), m.flag, props))
        body = encode_batch(items)
        if len(body) > self.max_message_size:
            raise MessageTooLargeError(
                f"batch is {len(body)} bytes, over the limit of {self.max_message_size}; split it"
            )
        props = {Prop.WAIT_STORE_MSG_OK: "true" if msgs[0].wait_store_msg_ok else "false"}
        return topic, body, props, ",".join(ids)

    async def send_batch(self, msgs: Sequence[Message], timeout: float | None = None) -> SendResult:
        """Send messages of one topic in one request (SEND_BATCH_MESSAGE); msg_id joins their ids with commas."""
        topic, body, props, ids = self._batch(msgs)
        result = await self._send_with_retries(
            topic,
            body,
            0,
            props,
            ids,
            0,
            batch=True,
            timeout=timeout,
            attempts=1 + self.retry_times,
        )
        assert result is not None
        return result

    async def send_batch_to_queue(
        self, msgs: Sequence[Message], mq: MessageQueue, timeout: float | None = None
    ) -> SendResult:
        """A batch to one given queue (Java's ``send(Collection<Message>, MessageQueue)``): one attempt."""
        topic, body, props, ids = self._batch(msgs)
        if mq.topic != topic:
            raise ClientError(f"queue {mq} is not of the batch's topic {topic!r}")
        return await self._send_to(mq, self._header(topic, mq, 0, props), body, ids, True, timeout, props)

    async def send_to_queue(self, msg: Message, mq: MessageQueue, timeout: float | None = None) -> SendResult:
        """Send to one given queue: one attempt, no fault avoidance (ordering matters more)."""
        if mq.topic != msg.topic:
            raise ClientError(f"queue {mq} is not of the message's topic {msg.topic!r}")
        body, sys_flag, props = self._prepare(msg)
        header = self._header(msg.topic, mq, sys_flag, props, msg.flag)
        return await self._send_to(
            mq, header, body, props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX], False, timeout, props
        )

    async def _send_to(
        self,
        mq: MessageQueue,
        header: dict[str, Any],
        body: bytes,
        uniq: str,
        batch: bool,
        timeout: float | None,
        props: dict[str, str],
    ) -> SendResult:
        timeout = self.send_timeout if timeout is None else timeout
        if self.instance.broker_address(mq.broker_name) is None:
            await self.publish_queues(mq.topic)
        begin = time.monotonic()
        try:
            result = await self._attempt(
                mq, header, body, uniq, batch=batch, oneway=False, timeout=timeout, props=props
            )
        except (RemotingError, BrokerError) as exc:
            self.selector.record(mq.broker_name, (time.monotonic() - begin) * 1000, True)
            raise SendFailedError(f"send to {mq} failed: {exc}", [exc]) from exc
        self.selector.record(mq.broker_name, (time.monotonic() - begin) * 1000, False)
        assert result is not None
        return result

    async def send_orderly(
        self,
        msg: Message,
        sharding_key: Any,
        selector: MessageQueueSelector = select_by_hash,
        timeout: float | None = None,
    ) -> SendResult:
        """Send to the queue ``selector`` picks for ``sharding_key`` (same key, same queue, same order)."""
        queues = await self.publish_queues(msg.topic)
        mq = selector(queues, msg, sharding_key)
        return await self.send_to_queue(msg, mq, timeout)

    async def send_in_transaction(self, msg: Message, arg: Any = None) -> SendResult:
        """Transactional sends need a listener: use :class:`tidemq.client.TransactionProducer`."""
        raise NotImplementedError(
            "use tidemq.client.TransactionProducer(group, listener, ...) for transactions"
        )

    # ------------------------------------------------------------------ request-reply (tidemq.client.request_reply)
    async def request(
        self,
        msg: Message,
        timeout: float = 3.0,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> MessageExt:
        """Send ``msg`` as a request and await the reply; :class:`RequestTimeoutError` when none comes."""
        return await request_reply.request(self, msg, timeout, selector=selector, arg=arg)

    def request_async(
        self,
        msg: Message,
        timeout: float = 3.0,
        callback: request_reply.RequestCallback | None = None,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> asyncio.Task[MessageExt]:
        """:meth:`request` in the background; ``callback(reply, error)`` runs when it completes."""
        task = asyncio.get_running_loop().create_task(
            request_reply.request(self, msg, timeout, selector=selector, arg=arg, callback=callback)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if callback is not None:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def request_to_queue(self, msg: Message, mq: MessageQueue, timeout: float = 3.0) -> MessageExt:
        """A request to one given queue."""
        if mq.topic != msg.topic:
            raise ClientError(f"queue {mq} is not of the message's topic {msg.topic!r}")
        return await request_reply.request(self, msg, timeout, mq=mq)

    async def send_reply(self, reply: Message, timeout: float | None = None) -> SendResult:
        """Send a reply made by :func:`~tidemq.client.create_reply` (SEND_REPLY_MESSAGE_V2)."""
        return await request_reply.send_reply(self, reply, timeout)
