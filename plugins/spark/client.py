"""Blocking access to tidemq for Spark's Python workers, over tidemq's client API.

Spark calls data sources from plain threads of short-lived worker processes, so each
:class:`TidemqSession` owns a private event loop driven with ``run_until_complete`` from the
calling thread: no background thread, nothing left running when the session closes.  Requests
go through :class:`tidemq.client.ClientAPI` (routes, offsets, PULL_MESSAGE with the
subscription in the request, so no heartbeat or rebalance is involved).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from tidemq.client import (
    BrokerError,
    ClientAPI,
    SendFailedError,
    TopicRoute,
    split_namesrv,
)
from tidemq.plugins import get_plugin_manager
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingConnectError, RemotingError

from .client_options import ClientOptions
from .options import QueueKey, TidemqSparkError

if TYPE_CHECKING:
    from .pull import PulledRecords

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Topics a pattern never matches: RocketMQ's internal topics.
_SYSTEM_TOPIC = re.compile(
    r"^(%RETRY%|%DLQ%|%SYS%|RMQ_SYS_|rmq_sys_).*|^(TBW102|SCHEDULE_TOPIC_XXXX|OFFSET_MOVED_EVENT|"
    r"SELF_TEST_TOPIC|BenchmarkTest|TRANS_CHECK_MAX_TIME_TOPIC)$"
)


def _denied(addr: str, code: int, remark: str | None, client: ClientOptions) -> TidemqSparkError:
    """The one error for a request the broker's ACL refused (names the access key, never the secret)."""
    try:
        what = RequestCode(code).name
    except ValueError:
        what = f"request {code}"
    return TidemqSparkError(
        f"broker {addr} refused {what} ({client.describe()}): {remark or 'no permission'}; "
        "check the accessKey/secretKey options and the account's permissions"
    )


class _SecuredRemoting:
    """The session's transport client: signs each request when keys are given, and turns the
    broker's NO_PERMISSION answer into one :class:`TidemqSparkError` whatever the request."""

    def __init__(self, inner: Any, client: ClientOptions) -> None:
        self._inner = inner
        self._client = client
        self._credentials = client.credentials

    async def invoke(self, address: str, request: Any, timeout: float) -> Any:
        if self._credentials is not None:
            self._credentials.sign(request)
        resp = await self._inner.invoke(address, request, timeout)
        if resp is not None and resp.code == ResponseCode.NO_PERMISSION:
            raise _denied(address, request.code, resp.remark, self._client)
        return resp

    async def invoke_oneway(self, address: str, request: Any) -> None:
        if self._credentials is not None:
            self._credentials.sign(request)
        await self._inner.invoke_oneway(address, request)

    async def close(self) -> None:
        await self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class TidemqSession:
    """One transport client and event loop; use as a context manager."""

    def __init__(self, namesrv: str, timeout_s: float = 10.0, client: ClientOptions | None = None) -> None:
        self.timeout_s = timeout_s
        self.client = client or ClientOptions()
        self.loop = _new_loop()
        transport = get_plugin_manager().create(
            "transport", "tcp", options=dict(self.client.transport_options)
        )
        self.remoting = _SecuredRemoting(transport.client(), self.client)
        self.api = ClientAPI(self.remoting, split_namesrv(namesrv), timeout_s)
        self.routes: dict[str, TopicRoute] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.run(self.remoting.close())
        finally:
            self.loop.close()

    def __enter__(self) -> TidemqSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ topics and routes
    def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        route = None if refresh else self.routes.get(topic)
        if route is None:
            route = self.run(self.api.get_route(topic))
            if route is None:
                raise TidemqSparkError(
                    f"topic {topic!r} has no route on NameServer {';'.join(self.api.namesrv)}"
                )
            self.routes[topic] = route
        return route

    def all_topics(self) -> list[str]:
        """Every topic the NameServers know (GET_ALL_TOPIC_LIST_FROM_NAMESERVER)."""
        topics: set[str] = set()
        errors = []
        for addr in self.api.namesrv:
            req = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
            try:
                resp = self.run(self.api.invoke(addr, req))
            except RemotingError as exc:
                errors.append(exc)
                continue
            if resp.code == ResponseCode.SUCCESS and resp.body:
                topics.update(str(t) for t in orjson.loads(resp.body).get("topicList") or [])
        if errors and not topics:
            raise TidemqSparkError(f"no NameServer answered the topic list: {errors[-1]}")
        return sorted(topics)

    def resolve_topics(self, topics: tuple[str, ...], pattern: str | None) -> list[str]:
        if not pattern:
            return list(topics)
        rx = re.compile(pattern)
        return [t for t in self.all_topics() if rx.fullmatch(t) and not _SYSTEM_TOPIC.match(t)]

    def queues(self, topic: str) -> list[QueueKey]:
        """Readable queues of ``topic`` whose broker has a master."""
        route = self.route(topic, refresh=True)
        live = route.addresses()
        return [
            QueueKey(topic, mq.broker_name, mq.queue_id)
            for mq in route.subscribe_queues()
            if mq.broker_name in live
        ]

    def address(self, key: QueueKey) -> str:
        addr = self.route(key.topic).addresses().get(key.broker)
        if addr is None:
            addr = self.route(key.topic, refresh=True).addresses().get(key.broker)
        if addr is None:
            raise TidemqSparkError(f"broker {key.broker!r} of topic {key.topic!r} has no master address")
        return addr

    # ------------------------------------------------------------------ offsets
    def _offset_call(self, fn: Any, key: QueueKey, *args: Any) -> int:
        mq = MessageQueue(key.topic, key.broker, key.queue_id)
        try:
            return int(self.run(fn(self.address(key), mq, *args)))
        except RemotingConnectError:
            return int(self.run(fn(self._refresh_address(key), mq, *args)))

    def _refresh_address(self, key: QueueKey) -> str:
        self.route(key.topic, refresh=True)
        return self.address(key)

    def min_offset(self, key: QueueKey) -> int:
        return self._offset_call(self.api.get_min_offset, key)

    def max_offset(self, key: QueueKey) -> int:
        return self._offset_call(self.api.get_max_offset, key)

    def search_offset(self, key: QueueKey, timestamp_ms: int) -> int:
        return self._offset_call(self.api.search_offset, key, timestamp_ms)

    def committed_offset(self, key: QueueKey, group: str) -> int:
        mq = MessageQueue(key.topic, key.broker, key.queue_id)
        return int(self.run(self.api.query_consumer_offset(self.address(key), group, mq)))

    def commit_offset(self, key: QueueKey, group: str, offset: int) -> None:
        mq = MessageQueue(key.topic, key.broker, key.queue_id)
        self.run(self.api.update_consumer_offset(self.address(key), group, mq, offset))

    # ------------------------------------------------------------------ pulling
    def read_range(self, key: QueueKey, start: int, end: int, **kw: Any) -> Iterator[PulledRecords]:
        """Pulls of ``key`` with offsets in ``[start, end)`` (each iterates as ``MessageExt`` s): see
        :func:`tidemq_spark.pull.read_range`."""
        from .pull import read_range

        return read_range(self, key, start, end, **kw)


class BatchSender:
    """A tidemq :class:`~tidemq.client.Producer` on a private loop sending SEND_BATCH_MESSAGE batches.

    Messages are grouped per topic and queue into batches of at most ``batch_size`` messages and
    ``max_batch_bytes`` body bytes; up to ``max_in_flight`` batches are awaited together.  A batch
    for a chosen queue (``add(msg, queue)``) goes to that queue only after the previous batch
    for it was answered, so rows of one key keep their order.
    """

    def __init__(
        self,
        namesrv: str,
        group: str,
        *,
        batch_size: int = 128,
        max_batch_bytes: int = 1024 * 1024,
        max_in_flight: int = 4,
        timeout_s: float = 10.0,
        client: ClientOptions | None = None,
    ) -> None:
        from tidemq.client import Producer

        self.client = client or ClientOptions()
        self.loop = _new_loop()
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.sent = 0
        self._pending: dict[tuple[str, MessageQueue | None], tuple[list[Any], int]] = {}
        self._inflight: list[asyncio.Task[Any]] = []
        #: The last send task of each chosen queue (the next one waits for it).
        self._tails: dict[MessageQueue, asyncio.Task[Any]] = {}
        self._queues: dict[str, list[MessageQueue]] = {}

        async def make() -> Producer:
            producer = Producer(
                group,
                namesrv,
                send_timeout=timeout_s,
                credentials=self.client.credentials,
                transport_options=dict(self.client.transport_options),
            )
            await producer.start()
            return producer

        try:
            self.producer = self.loop.run_until_complete(make())
        except BaseException:
            self.loop.close()
            raise

    def write_queues(self, topic: str) -> list[MessageQueue]:
        """Writable queues of ``topic`` in RocketMQ's order (by broker name, then queue id), cached."""
        queues = self._queues.get(topic)
        if queues is None:
            queues = self._queues[topic] = list(
                self.loop.run_until_complete(self.producer.publish_queues(topic))
            )
        return queues

    def add(self, msg: Any, queue: MessageQueue | None = None) -> None:
        """Queue ``msg`` (a :class:`tidemq.client.Message`) for ``queue`` (None: the producer picks); full batches go out."""
        slot = (msg.topic, queue)
        msgs, size = self._pending.get(slot, ([], 0))
        body = len(msg.body) + 64
        if msgs and (len(msgs) >= self.batch_size or size + body > self.max_batch_bytes):
            self._send(msgs, queue)
            msgs, size = [], 0
        msgs.append(msg)
        self._pending[slot] = (msgs, size + body)

    def _send(self, msgs: list[Any], queue: MessageQueue | None) -> None:
        if queue is None:
            task = self.loop.create_task(self.producer.send_batch(msgs, self.timeout_s))
        else:
            task = self.loop.create_task(self._send_after(self._tails.get(queue), msgs, queue))
            self._tails[queue] = task
        self._inflight.append(task)
        self.sent += len(msgs)
        if len(self._inflight) >= self.max_in_flight:
            self._drain()

    async def _send_after(
        self, previous: asyncio.Task[Any] | None, msgs: list[Any], queue: MessageQueue
    ) -> Any:
        if previous is not None:
            await previous  # its failure fails this batch too: never overtake a lost batch
        # One attempt, on the chosen queue: per-key order beats failover (the Spark task retries).
        return await self.producer.send_batch_to_queue(msgs, queue, self.timeout_s)

    def _drain(self) -> None:
        tasks, self._inflight = self._inflight, []
        self._tails.clear()
        if not tasks:
            return
        try:
            # gather re-raises the first failure: the Spark task fails and is retried (at least once).
            self.loop.run_until_complete(asyncio.gather(*tasks))
        except (BrokerError, SendFailedError) as exc:
            denied = _denial(exc)
            if denied is not None:
                raise _denied(
                    denied.broker or "?", RequestCode.SEND_BATCH_MESSAGE, denied.remark, self.client
                ) from None
            raise

    def flush(self) -> int:
        """Send every queued message and wait for all answers; the number of messages sent."""
        for (_, queue), (msgs, _) in self._pending.items():
            if msgs:
                self._send(msgs, queue)
        self._pending.clear()
        self._drain()
        return self.sent

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            for task in self._inflight:
                task.cancel()
            if self._inflight:
                self.loop.run_until_complete(asyncio.gather(*self._inflight, return_exceptions=True))
            self.loop.run_until_complete(self.producer.shutdown())
        finally:
            self.loop.close()


def _denial(exc: BaseException) -> BrokerError | None:
    """The broker's NO_PERMISSION answer behind a failed send, if that is what failed it."""
    if isinstance(exc, BrokerError):
        return exc if exc.code == ResponseCode.NO_PERMISSION else None
    for inner in getattr(exc, "errors", None) or []:
        found = _denial(inner)
        if found is not None:
            return found
    return None
