"""A blocking facade over the asyncio client: one background event-loop thread runs everything.

    with BlockingProducer("group", namesrv="127.0.0.1:9876") as producer:
        producer.send(Message("TopicA", b"hello"))

Listeners of a blocking push consumer are plain functions, run on the consumer's thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Self, TypeVar

from tidemq.client.message import Message, PullResult, SendResult
from tidemq.client.producer import MessageQueueSelector, Producer, select_by_hash
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.push_consumer import Listener, PushConsumer
from tidemq.message import MessageExt
from tidemq.queues import BoundaryType, MessageQueue

T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread; ``run(coro)`` waits for the result from any thread."""

    def __init__(self, name: str = "tidemq-client-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking call made from the client's own loop thread (inside a listener?)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


class _Blocking:
    """Lifecycle shared by the facades: ``_client`` is the wrapped asyncio producer or consumer."""

    _client: Any

    def __init__(self, loop: LoopThread | None) -> None:
        self._own_loop = loop is None
        self._loop = loop or LoopThread()

    def start(self) -> None:
        self._loop.run(self._client.start())

    def shutdown(self) -> None:
        try:
            self._loop.run(self._client.shutdown())
        finally:
            self._close_loop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _build(self, factory: Any, *args: Any, **kwargs: Any) -> Any:
        async def make() -> Any:
            return factory(*args, **kwargs)

        return self._loop.run(make())

    def _close_loop(self) -> None:
        if self._own_loop:
            self._loop.stop()


class BlockingProducer(_Blocking):
    """:class:`Producer` with blocking methods."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        loop: LoopThread | None = None,
        **options: Any,
    ) -> None:
        super().__init__(loop)
        self.producer: Producer = self._build(Producer, group, namesrv, **options)
        self._client = self.producer

    def send(self, msg: Message, timeout: float | None = None) -> SendResult:
        return self._loop.run(self.producer.send(msg, timeout))

    def send_async(self, msg: Message, timeout: float | None = None) -> concurrent.futures.Future[SendResult]:
        """A future resolved with the SendResult (or the error) when the broker answers."""
        return self._loop.submit(self.producer.send(msg, timeout))

    def send_oneway(self, msg: Message) -> None:
        self._loop.run(self.producer.send_oneway(msg))

    def send_batch(self, msgs: Sequence[Message], timeout: float | None = None) -> SendResult:
        return self._loop.run(self.producer.send_batch(msgs, timeout))

    def send_orderly(
        self, msg: Message, sharding_key: Any, selector: MessageQueueSelector = select_by_hash
    ) -> SendResult:
        return self._loop.run(self.producer.send_orderly(msg, sharding_key, selector))

    def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        """Send a request and wait for its reply (``RequestTimeoutError`` after ``timeout`` s)."""
        return self._loop.run(self.producer.request(msg, timeout))

    def send_reply(self, reply: Message, timeout: float | None = None) -> SendResult:
        """Send a reply made by ``create_reply`` (from a consumer's listener thread)."""
        return self._loop.run(self.producer.send_reply(reply, timeout))


class BlockingPushConsumer(_Blocking):
    """:class:`PushConsumer` with blocking start/shutdown; listeners run on its thread pool."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        loop: LoopThread | None = None,
        **options: Any,
    ) -> None:
        super().__init__(loop)
        self.consumer: PushConsumer = self._build(PushConsumer, group, namesrv, **options)
        self._client = self.consumer

    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        self.consumer.subscribe(topic, expression, expression_type)

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        self.consumer.register_listener(listener, orderly=orderly)


class BlockingPullConsumer(_Blocking):
    """:class:`PullConsumer` with blocking methods."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        loop: LoopThread | None = None,
        **options: Any,
    ) -> None:
        super().__init__(loop)
        self.consumer: PullConsumer = self._build(PullConsumer, group, namesrv, **options)
        self._client = self.consumer

    def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.consumer.fetch_subscribe_queues(topic))

    def pull(
        self, mq: MessageQueue, expression: str = "*", offset: int = 0, max_nums: int = 32, **kw: Any
    ) -> PullResult:
        return self._loop.run(self.consumer.pull(mq, expression, offset, max_nums, **kw))

    def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        return self._loop.run(self.consumer.fetch_consume_offset(mq, from_store))

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        self._loop.run(self.consumer.update_consume_offset(mq, offset))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._loop.run(self.consumer.max_offset(mq))

    def search_offset(
        self, mq: MessageQueue, timestamp_ms: int, boundary_type: BoundaryType = BoundaryType.LOWER
    ) -> int:
        return self._loop.run(self.consumer.search_offset(mq, timestamp_ms, boundary_type))

    def assign(self, queues: Sequence[MessageQueue]) -> None:
        self._loop.run(self.consumer.assign(queues))

    def poll(self, max_nums: int = 32, expression: str = "*", timeout: float = 1.0) -> list[MessageExt]:
        return self._loop.run(self.consumer.poll(max_nums, expression, timeout))

    def commit(self) -> None:
        self._loop.run(self.consumer.commit())
