"""The pull consumer: the application names queues and offsets (RocketMQ's DefaultMQPullConsumer).

Also a small assign-style API (``assign`` / ``seek`` / ``poll`` / ``commit``) over it, in the
spirit of RocketMQ's lite pull consumer.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidemq.client.api import PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND
from tidemq.client.errors import ClientError
from tidemq.client.instance import ClientInstance
from tidemq.client.message import PullResult, PullStatus
from tidemq.client.offset_store import OffsetStore, consumer_offset_store
from tidemq.client.rebalance import CLUSTERING, check_consumer
from tidemq.client.subscription import Subscription, prepare
from tidemq.message import MessageExt
from tidemq.observe import ConsumeContext
from tidemq.queues import BoundaryType, MessageQueue
from tidemq.remoting.errors import RemotingError
from tidemq.trace.hooks import make_tracer

log = logging.getLogger(__name__)


class PullConsumer:
    """Pull messages from explicit queues at explicit offsets."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        message_model: str = CLUSTERING,
        offset_dir: str | Path | None = None,
        instance: ClientInstance | None = None,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        trace_queue_size: int = 2048,
        **instance_options: Any,
    ) -> None:
        check_consumer(group, message_model)
        self.group = group
        self.message_model = message_model
        self.instance = instance or ClientInstance(namesrv, **instance_options)
        self.offset_store: OffsetStore = consumer_offset_store(
            self.instance, group, message_model, offset_dir
        )
        self._topics: set[str] = set()
        self._assigned: list[MessageQueue] = []
        self._positions: dict[MessageQueue, int] = {}
        self._turn = itertools.count()
        self._started = False
        self.started_at_ms = 0
        #: Message trace (docs/trace.md): ``None`` unless ``enable_msg_trace``; :meth:`poll` records.
        self.tracer = make_tracer(
            group, "CONSUME", self.instance, enable_msg_trace, trace_topic, trace_queue_size
        )

    async def start(self) -> None:
        if self._started:
            return
        await self.instance.start()
        self.instance.register_consumer(self)
        await self.offset_store.load()
        if self.tracer is not None:
            await self.tracer.start()
        self._started = True
        self.started_at_ms = int(time.time() * 1000)

    async def shutdown(self) -> None:
        if not self._started:
            return
        await self.offset_store.persist(list(self.offset_store.table))  # type: ignore[attr-defined]
        self._started = False
        if self.tracer is not None:
            await self.tracer.shutdown()
        self.instance.unregister(self)
        await self.instance.unregister_everywhere(consumer_group=self.group)
        await self.instance.stop()

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ member protocol
    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": "CONSUME_ACTIVELY",
            "messageModel": self.message_model,
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [Subscription.build(t).to_json() for t in sorted(self._topics)],
            "unitMode": False,
        }

    def topics(self) -> set[str]:
        return set(self._topics)

    # ------------------------------------------------------------------ queues and offsets
    def _require_started(self) -> None:
        if not self._started:
            raise ClientError("consumer is not started; call 'await consumer.start()' first")

    async def fetch_subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of ``topic``."""
        self._require_started()
        route = await self.instance.get_route(topic, refresh=topic not in self._topics)
        if route is None:
            from tidemq.client.errors import NoRouteError

            raise NoRouteError(f"no route for topic {topic!r}")
        new = topic not in self._topics
        self._topics.add(topic)
        if new:
            await self.instance.send_heartbeats()
        return route.subscribe_queues()

    async def _address(self, mq: MessageQueue) -> str:
        addr = self.instance.broker_address(mq.broker_name)
        if addr is None:
            await self.instance.get_route(mq.topic, refresh=True)
            addr = self.instance.broker_address(mq.broker_name)
        if addr is None:
            addr = self.instance.read_address(mq.broker_name)  # HA (issue 7): a slave answers reads
        if addr is None:
            raise ClientError(f"broker {mq.broker_name} of {mq} has no known master")
        return addr

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self.instance.require_api().get_max_offset(await self._address(mq), mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.instance.require_api().get_min_offset(await self._address(mq), mq)

    async def search_offset(
        self, mq: MessageQueue, timestamp_ms: int, boundary_type: BoundaryType = BoundaryType.LOWER
    ) -> int:
        """The offset of ``mq`` at ``timestamp_ms`` (:class:`~tidemq.queues.BoundaryType`: of several
        messages of that store time, LOWER the first, UPPER the last)."""
        api = self.instance.require_api()
        return await api.search_offset(await self._address(mq), mq, timestamp_ms, boundary_type)

    async def fetch_consume_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        """The group's committed offset of ``mq`` (-1 when none)."""
        self._require_started()
        return await self.offset_store.read(mq, from_store=from_store)

    async def update_consume_offset(self, mq: MessageQueue, offset: int, *, persist: bool = True) -> None:
        self.offset_store.update(mq, offset, increase_only=False)
        if persist:
            await self.offset_store.persist([mq])

    # ------------------------------------------------------------------ pulling
    async def pull(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        *,
        timeout: float = 10.0,
        suspend: float = 0.0,
    ) -> PullResult:
        """Pull up to ``max_nums`` messages from ``offset``; with ``suspend`` > 0 the broker holds the
        request until messages arrive or ``suspend`` seconds pass (long polling)."""
        self._require_started()
        if offset < 0:
            raise ClientError(f"offset = {offset} must be >= 0")
        if not 0 < max_nums <= 1024:
            raise ClientError(f"max_nums = {max_nums} must be within 1..1024")
        sub = Subscription.build(mq.topic, expression)
        self._topics.add(mq.topic)
        sys_flag = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend > 0 else 0)
        ctx = ConsumeContext(
            side="client",
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            client_address=self.instance.client_id,
        )
        hook = self.instance.manager.hook
        hook.tidemq_before_consume(context=ctx)
        begin = time.monotonic()
        api = self.instance.require_api()

        async def pull_from(addr: str) -> PullResult:
            return await api.pull(
                addr,
                group=self.group,
                mq=mq,
                offset=offset,
                max_nums=max_nums,
                sys_flag=sys_flag,
                commit_offset=0,
                suspend_ms=int(suspend * 1000),
                subscription=sub.expression,
                sub_version=sub.version,
                expression_type=sub.expression_type,
                timeout=max(timeout, suspend + 5.0),
            )

        # HA (issue 7): read from the master, else (gone or unreachable) from a slave of the broker.
        addr = self.instance.read_address(mq.broker_name) or await self._address(mq)
        try:
            result = await pull_from(addr)
        except (RemotingError, OSError, TimeoutError):
            self.instance.mark_down(addr)
            other = self.instance.read_address(mq.broker_name)
            if other is None or other == addr:
                raise
            result = await pull_from(other)
        if result.status is PullStatus.FOUND:
            result = PullResult(
                status=result.status,
                next_begin_offset=result.next_begin_offset,
                min_offset=result.min_offset,
                max_offset=result.max_offset,
                messages=prepare(result.messages, sub),
                suggest_broker_id=result.suggest_broker_id,
            )
        ctx.status, ctx.message_count = result.status.value, len(result.messages)
        ctx.elapsed_ms = (time.monotonic() - begin) * 1000
        hook.tidemq_after_consume(context=ctx)
        return result

    async def pull_block_if_not_found(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        suspend: float = 15.0,
    ) -> PullResult:
        return await self.pull(mq, expression, offset, max_nums, suspend=suspend)

    # ------------------------------------------------------------------ assign-style API
    async def assign(self, queues: Sequence[MessageQueue]) -> None:
        """Consume exactly these queues from their committed offsets (first offset when none)."""
        self._require_started()
        self._assigned = list(queues)
        for mq in queues:
            if mq not in self._positions:
                committed = await self.offset_store.read(mq, from_store=True)
                self._positions[mq] = committed if committed >= 0 else await self.min_offset(mq)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        if mq not in self._assigned:
            raise ClientError(f"{mq} is not assigned")
        self._positions[mq] = offset

    def position(self, mq: MessageQueue) -> int:
        return self._positions[mq]

    async def poll(self, max_nums: int = 32, expression: str = "*", timeout: float = 1.0) -> list[MessageExt]:
        """Messages from the next assigned queue that has some (long-polls the last one up to ``timeout``)."""
        if not self._assigned:
            raise ClientError("no queue assigned; call assign() first")
        start = next(self._turn)
        n = len(self._assigned)
        for i in range(n):
            mq = self._assigned[(start + i) % n]
            last = i == n - 1
            result = await self.pull(
                mq, expression, self._positions[mq], max_nums, suspend=timeout if last else 0.0
            )
            self._positions[mq] = result.next_begin_offset
            if result.messages:
                if self.tracer is not None:
                    # As DefaultLitePullConsumer: a poll is its consume; handing the messages over is success.
                    self.tracer.sub_after(self.tracer.sub_before(result.messages), len(result.messages), True)
                return result.messages
        return []

    async def commit(self) -> None:
        """Commit the current positions of every assigned queue."""
        for mq in self._assigned:
            self.offset_store.update(mq, self._positions[mq], increase_only=False)
        await self.offset_store.persist(self._assigned)

    # ------------------------------------------------------------------ operators (via the broker)
    async def reset_offset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: commit the given offsets; assigned queues continue there."""
        mqs = [mq for mq in table if mq.topic == topic]
        for mq in mqs:
            self.offset_store.update(mq, table[mq], increase_only=False)
        await self.offset_store.persist(mqs)
        for mq in mqs:  # after the commit: whoever sees the new position finds it committed
            if mq in self._positions:
                self._positions[mq] = table[mq]
        log.info("offsets of %s reset by an operator for %s", topic, self.group)

    def consumer_status(self, topic: str) -> dict[MessageQueue, int]:
        """GET_CONSUMER_STATUS_FROM_CLIENT: the offsets held for ``topic``."""
        table: dict[MessageQueue, int] = self.offset_store.table  # type: ignore[attr-defined]
        return {mq: off for mq, off in table.items() if mq.topic == topic}

    def running_info(self, with_jstack: bool = False) -> dict[str, Any]:
        """ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO): no process queues in a pull consumer."""
        from tidemq.client import diagnostics

        props = {
            "consumerGroup": self.group,
            "messageModel": self.message_model,
            "instanceName": self.instance.instance_name,
            "clientIP": self.instance.ip,
            "PROP_CONSUMER_START_TIMESTAMP": self.started_at_ms,
        }
        return diagnostics.running_info(
            properties=props,
            subscriptions=[Subscription.build(t).to_json() for t in sorted(self._topics)],
            mq_table={},
            status_table={},
            with_jstack=with_jstack,
        )
