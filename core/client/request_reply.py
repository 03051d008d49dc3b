"""Request-reply (RocketMQ 4.6+): a producer sends a request and awaits the reply message.

The requester marks the request with ``CORRELATION_ID`` (fresh per request), ``REPLY_TO_CLIENT``
(its client id) and ``TTL`` (the timeout in ms), as RocketMQ's ``prepareSendRequest`` does, and
waits in the :class:`RequestFutureTable`.  A consumer answers with :func:`create_reply`, sent by a
producer's :meth:`~tidemq.client.Producer.send_reply` or ``send`` (both SEND_REPLY_MESSAGE_V2, as
the Java client sends a message whose ``MSG_TYPE`` is ``reply``).  The broker pushes the reply to the requester
over the requester's own connection (PUSH_REPLY_MESSAGE_TO_CLIENT), and :func:`receive_reply`
completes the waiting future.  A reply for a request already timed out is dropped and counted
(:attr:`RequestFutureTable.late_replies`).

The table is per process, as RocketMQ's RequestFutureHolder: correlation ids are random UUIDs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.address import split_address
from tidemq.client.compression import decompress
from tidemq.client.errors import BrokerError, ClientError
from tidemq.client.message import Message, SendResult
from tidemq.client.route import AUTO_CREATE_TOPIC
from tidemq.message import MessageExt, Prop, string_to_properties
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.client.producer import MessageQueueSelector, Producer
    from tidemq.queues import MessageQueue

log = logging.getLogger(__name__)

#: RocketMQ's MixAll.REPLY_MESSAGE_FLAG: the ``MSG_TYPE`` of a reply.
REPLY_MESSAGE_FLAG = "reply"
#: RocketMQ's MixAll.REPLY_TOPIC_POSTFIX.
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"

#: ``callback(reply, error)`` of :meth:`Producer.request_async`: exactly one of them is None.
RequestCallback = Callable[[MessageExt | None, BaseException | None], Any]


def reply_topic(cluster: str) -> str:
    """``<cluster>_REPLY_TOPIC`` (MixAll.getReplyTopic)."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


class RequestTimeoutError(ClientError):
    """The request was sent but no reply came within its timeout (RocketMQ's RequestTimeoutException)."""

    def __init__(self, message: str, topic: str = "", timeout: float = 0.0, correlation_id: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.timeout = timeout
        self.correlation_id = correlation_id


def create_reply(request: MessageExt | Message, body: bytes) -> Message:
    """The reply to ``request`` (RocketMQ's MessageUtil.createReplyMessage), to send with
    :meth:`Producer.send_reply`: topic ``<cluster>_REPLY_TOPIC``, ``MSG_TYPE=reply`` and the
    request's ``CORRELATION_ID``, ``REPLY_TO_CLIENT`` and ``TTL``."""
    if request is None:
        raise ClientError("create reply message fail, requestMessage cannot be null.")
    props = request.properties
    cluster = props.get(Prop.CLUSTER)
    if not cluster:
        raise ClientError(
            f"create reply message fail, requestMessage error, property[{Prop.CLUSTER}] is null "
            "(is it a request, sent by Producer.request?)"
        )
    reply_props = {Prop.MESSAGE_TYPE: REPLY_MESSAGE_FLAG}
    for key in (Prop.CORRELATION_ID, Prop.REPLY_TO_CLIENT, Prop.MESSAGE_TTL):
        value = props.get(key)
        if value is not None:
            reply_props[key] = value
    return Message(reply_topic(cluster), bytes(body), properties=reply_props)


def is_reply(props: dict[str, str]) -> bool:
    return props.get(Prop.MESSAGE_TYPE) == REPLY_MESSAGE_FLAG


class RequestFuture:
    """One request awaiting its reply (RequestResponseFuture)."""

    __slots__ = ("callback", "correlation_id", "deadline", "future", "send_ok", "timeout", "timer", "topic")

    def __init__(
        self,
        correlation_id: str,
        topic: str,
        timeout: float,
        callback: RequestCallback | None = None,
        begin: float | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.correlation_id = correlation_id
        self.topic = topic
        self.timeout = timeout
        #: ``timeout`` counts from ``begin`` (the request call), route lookup included.
        self.deadline = (time.monotonic() if begin is None else begin) + timeout
        self.future: asyncio.Future[MessageExt] = loop.create_future()
        self.callback = callback
        self.send_ok = False
        self.timer: asyncio.TimerHandle | None = None

    def timeout_error(self) -> RequestTimeoutError:
        ms = int(self.timeout * 1000)
        if self.send_ok:
            text = f"send request message to <{self.topic}> OK, but wait reply message timeout, {ms} ms."
        else:
            text = f"request to <{self.topic}> timed out after {ms} ms before the broker took it."
        return RequestTimeoutError(text, self.topic, self.timeout, self.correlation_id)

    def complete(self, reply: MessageExt | None, error: BaseException | None) -> None:
        """Resolve the future (on its loop) and run the callback once."""
        if self.timer is not None:
            self.timer.cancel()
        fut = self.future
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            assert reply is not None
            fut.set_result(reply)
        if self.callback is not None:
            fut.exception()  # seen by the callback: no "exception never retrieved"
            try:
                self.callback(reply, error)
            except Exception:
                log.exception("request callback for %s failed", self.correlation_id)


class RequestFutureTable:
    """Correlation id -> :class:`RequestFuture` (RequestFutureHolder's table), with its sweep."""

    def __init__(self) -> None:
        self.futures: dict[str, RequestFuture] = {}
        #: Replies that matched no waiting request (it timed out, or was never ours): dropped.
        self.late_replies = 0
        self.replies = 0

    def add(self, rf: RequestFuture) -> None:
        self.futures[rf.correlation_id] = rf
        # A timer at the deadline: callback-form requests time out with nobody awaiting them.
        delay = max(0.0, rf.deadline - time.monotonic())
        rf.timer = rf.future.get_loop().call_later(delay, self._expire, rf.correlation_id)

    def remove(self, correlation_id: str) -> None:
        rf = self.futures.pop(correlation_id, None)
        if rf is not None and rf.timer is not None:
            rf.timer.cancel()

    def _expire(self, correlation_id: str) -> None:
        rf = self.futures.pop(correlation_id, None)
        if rf is not None:
            rf.complete(None, rf.timeout_error())

    def sweep(self, now: float | None = None) -> int:
        """Fail every request past its deadline (scanExpiredRequest); returns how many."""
        now = time.monotonic() if now is None else now
        expired = [cid for cid, rf in self.futures.items() if rf.deadline <= now]
        for cid in expired:
            self._expire(cid)
        return len(expired)

    def deliver(self, reply: MessageExt) -> bool:
        """Hand ``reply`` to its request; False (and counted) when none waits for it."""
        cid = reply.properties.get(Prop.CORRELATION_ID, "")
        rf = self.futures.pop(cid, None)
        if rf is None:
            self.late_replies += 1
            log.debug("reply %s matches no waiting request (timed out?): dropped", cid)
            return False
        self.replies += 1
        loop = rf.future.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            rf.complete(reply, None)
        else:  # a requester on another loop than the instance answering the broker
            loop.call_soon_threadsafe(rf.complete, reply, None)
        return True


#: The process's table (RocketMQ's RequestFutureHolder.getInstance()).
REQUESTS = RequestFutureTable()


def late_replies() -> int:
    """Replies dropped because their request had timed out already (or was unknown)."""
    return REQUESTS.late_replies


# ---------------------------------------------------------------------- requester side
def _prepare(producer: Producer, msg: Message, timeout: float) -> str:
    """Set CORRELATION_ID, REPLY_TO_CLIENT and TTL on ``msg`` (prepareSendRequest)."""
    if timeout <= 0:
        raise ClientError(f"request timeout = {timeout} must be > 0 seconds")
    cid = str(uuid.uuid4())
    msg.properties[Prop.CORRELATION_ID] = cid
    msg.properties[Prop.REPLY_TO_CLIENT] = producer.instance.client_id
    msg.properties[Prop.MESSAGE_TTL] = str(int(timeout * 1000))
    return cid


async def _route_and_heartbeat(producer: Producer, msg: Message) -> None:
    """The first request to a topic: learn its route and tell its brokers about this producer
    at once (the broker pushes replies only to producers it knows from a heartbeat)."""
    instance = producer.instance
    known = msg.topic in instance.routes
    await producer.publish_queues(msg.topic)
    # A topic the broker is yet to create on this send: the auto-create route's brokers take it.
    route = instance.routes.get(msg.topic) or instance.routes.get(AUTO_CREATE_TOPIC)
    if route is not None and Prop.CLUSTER not in msg.properties:
        # RocketMQ's broker stamps CLUSTER on every message it stores; a responder needs it to
        # find the reply topic.  Set here from the route so it is there on any broker.
        clusters = {bd.cluster for bd in route.broker_datas if bd.cluster}
        if len(clusters) == 1:
            msg.properties[Prop.CLUSTER] = clusters.pop()
    if not known:
        await instance.send_heartbeats()


async def request(
    producer: Producer,
    msg: Message,
    timeout: float,
    *,
    selector: MessageQueueSelector | None = None,
    arg: Any = None,
    mq: MessageQueue | None = None,
    callback: RequestCallback | None = None,
) -> MessageExt:
    """Send ``msg`` as a request and await its reply (DefaultMQProducerImpl.request)."""
    begin = time.monotonic()
    cid = _prepare(producer, msg, timeout)
    await _route_and_heartbeat(producer, msg)
    rf = RequestFuture(cid, msg.topic, timeout, callback, begin)
    REQUESTS.add(rf)  # before the send: the reply may come before the send's answer
    remaining = timeout - (time.monotonic() - begin)
    try:
        if mq is not None:
            await producer.send_to_queue(msg, mq, remaining)
        elif selector is not None:
            queues = await producer.publish_queues(msg.topic)
            await producer.send_to_queue(msg, selector(queues, msg, arg), remaining)
        else:
            await producer.send(msg, remaining)
        rf.send_ok = True
    except Exception as exc:
        REQUESTS.remove(cid)
        if rf.future.done():  # timed out during the send: the send's failure is the news
            rf.future.exception()
        error = ClientError(f"send request message to <{msg.topic}> fail: {exc}")
        if callback is not None:
            rf.complete(None, error)
        raise error from exc
    try:
        return await asyncio.shield(rf.future)
    except RequestTimeoutError:
        if rf.send_ok:
            _heartbeat_soon(producer)
        raise
    finally:
        REQUESTS.remove(cid)


#: Client instance -> when :func:`_heartbeat_soon` last sent its heartbeats.
_last_heartbeat: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _heartbeat_soon(producer: Producer) -> None:
    """Heartbeat now (at most once a second per client) after a request went unanswered.

    The broker pushes a reply only to a producer it knows from a heartbeat; a restarted broker
    knows nobody until the next heartbeat (30 s by default): this shortens that to one lost request.
    """
    instance = producer.instance
    now = time.monotonic()
    if now - _last_heartbeat.get(instance, 0.0) < 1.0 or not instance.started:
        return
    _last_heartbeat[instance] = now
    task = asyncio.get_running_loop().create_task(instance.send_heartbeats())
    producer._pending.add(task)
    task.add_done_callback(producer._pending.discard)


# ---------------------------------------------------------------------- responder side
async def send_reply(producer: Producer, reply: Message, timeout: float | None = None) -> SendResult:
    """Send a reply (SEND_REPLY_MESSAGE_V2, which the client's send picks for a reply) to a
    broker of the reply topic, in one attempt: :class:`BrokerError` SYSTEM_ERROR when the broker
    could not push it to the requester.  ``producer.send(reply)`` works too, with its retries."""
    if not is_reply(reply.properties):
        raise ClientError(
            f"not a reply (no {Prop.MESSAGE_TYPE}={REPLY_MESSAGE_FLAG}): build it with create_reply"
        )
    timeout = producer.send_timeout if timeout is None else timeout
    body, sys_flag, props = producer._prepare(reply)
    queues = await producer.publish_queues(reply.topic)
    mq = producer.selector.select(reply.topic, queues, None)
    header = producer._header(reply.topic, mq, sys_flag, props, reply.flag)
    begin = time.monotonic()
    try:
        result = await producer._attempt(
            mq,
            header,
            body,
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
            batch=False,
            oneway=False,
            timeout=timeout,
            props=props,
        )
    except (RemotingError, BrokerError) as exc:
        elapsed = (time.monotonic() - begin) * 1000
        producer.selector.record(mq.broker_name, elapsed, isinstance(exc, RemotingError))
        raise
    producer.selector.record(mq.broker_name, (time.monotonic() - begin) * 1000, False)
    assert result is not None  # not oneway
    return result


# ---------------------------------------------------------------------- broker -> requester
def _host(text: str | None) -> tuple[str, int]:
    try:
        return split_address(text or "")
    except ValueError:
        return "", 0


def _int(fields: dict[str, Any], name: str, default: int | None = None) -> int:
    value = fields.get(name)
    if value is None or value == "":
        if default is None:
            raise ValueError(f"the PUSH_REPLY_MESSAGE_TO_CLIENT header lacks {name!r}")
        return default
    return int(value)


def receive_reply(request: RemotingCommand) -> RemotingCommand | None:
    """PUSH_REPLY_MESSAGE_TO_CLIENT (ClientRemotingProcessor.receiveReplyMessage)."""
    arrived = int(time.time() * 1000)
    fields = dict(request.ext_fields or {})
    try:
        sys_flag = _int(fields, "sysFlag")
        props = string_to_properties(str(fields.get("properties") or ""))
        props[Prop.REPLY_MESSAGE_ARRIVE_TIME] = str(arrived)
        body = decompress(bytes(request.payload() or b""), sys_flag)
        reply = MessageExt(
            topic=str(fields.get("topic", "")),
            body=body,
            queue_id=_int(fields, "queueId", 0),
            flag=_int(fields, "flag", 0),
            queue_offset=0,
            commit_log_offset=0,
            sys_flag=sys_flag,
            born_timestamp=_int(fields, "bornTimestamp", 0),
            born_host=_host(fields.get("bornHost")),
            store_timestamp=_int(fields, "storeTimestamp", 0),
            store_host=_host(fields.get("storeHost")),
            reconsume_times=_int(fields, "reconsumeTimes", 0),
            prepared_transaction_offset=0,
            properties=props,
            body_crc=0,
            store_size=0,
        )
        REQUESTS.deliver(reply)
    except Exception as exc:
        log.warning("a pushed reply could not be read: %s", exc)
        return (
            None
            if request.is_oneway
            else request.reply(ResponseCode.SYSTEM_ERROR, "process reply message fail")
        )
    return None if request.is_oneway else request.reply()
