"""The push consumer (RocketMQ's DefaultMQPushConsumer): rebalance, long-polling pulls, listeners.

Every assigned queue gets a pull loop that long-polls the broker, parks what it gets in the
queue's :class:`ProcessQueue` (pausing while over 1000 messages or 100 MiB are waiting) and hands
messages to the listener: concurrently on a thread pool, or one at a time per queue for an
orderly listener (which first locks the queue on the broker).  Offsets advance only to the lowest
unfinished message; failed messages are sent back to the broker for a later retry.

One class in one module on purpose, as RocketMQ's ``DefaultMQPushConsumerImpl`` (twice this size):
rebalance, pull loops and both consume paths read and change the same state (the queue table, the
offset store, the queue locks, the running flag), so separate services would only pass it around.
What a queue holds is :mod:`tidemq.client.process_queue`; offsets are :mod:`tidemq.client.offset_store`.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tidemq.client import diagnostics
from tidemq.client.api import PULL_FLAG_COMMIT_OFFSET, PULL_FLAG_SUBSCRIPTION, PULL_FLAG_SUSPEND
from tidemq.client.errors import ClientError
from tidemq.client.instance import ClientInstance, run_every
from tidemq.client.message import PullStatus
from tidemq.client.offset_store import OffsetStore, consumer_offset_store
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.rebalance import BROADCASTING, CLUSTERING, Rebalancer, check_consumer
from tidemq.client.subscription import RETRY_PREFIX, Subscription, prepare, retry_topic
from tidemq.message import MessageExt, Prop
from tidemq.observe import ConsumeContext
from tidemq.queues import MessageQueue
from tidemq.remoting.errors import RemotingError
from tidemq.tasks import wait_event
from tidemq.trace.hooks import make_tracer

log = logging.getLogger(__name__)

#: Pause before pulling again after a "retry at once" answer that moved nothing: a slave behind
#: the consumer answers so while the master is down (a failover), and would be asked in a loop.
RETRY_PAUSE_S = 0.1


class ConsumeStatus(enum.Enum):
    """What a listener answers.  ``RECONSUME_LATER`` also means "suspend the queue a moment" for orderly."""

    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeFrom(enum.Enum):
    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


#: ``listener(messages) -> ConsumeStatus | bool | None``; may be a coroutine function.
#: ``None``/``True``/SUCCESS commit; ``False``/RECONSUME_LATER or an exception retry.
Listener = Callable[[list[MessageExt]], Any]


def parse_consume_from(value: ConsumeFrom | str) -> ConsumeFrom:
    """``ConsumeFrom``, its RocketMQ name, or ``"last"`` / ``"first"`` / ``"timestamp"``."""
    if isinstance(value, ConsumeFrom):
        return value
    short = {
        "last": ConsumeFrom.LAST_OFFSET,
        "first": ConsumeFrom.FIRST_OFFSET,
        "timestamp": ConsumeFrom.TIMESTAMP,
    }
    found = short.get(str(value).lower()) or next((c for c in ConsumeFrom if c.value == value), None)
    if found is None:
        raise ClientError(f"consume_from = {value!r}; choices: last, first, timestamp")
    return found


def _ok(result: Any) -> bool:
    if isinstance(result, ConsumeStatus):
        return result is ConsumeStatus.SUCCESS
    return result is None or result is True


class PushConsumer:
    """An asyncio push consumer.  ``subscribe`` topics, ``register_listener``, then ``start``."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        message_model: str = CLUSTERING,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int | None = None,
        allocate: str = "averagely",
        allocate_options: dict[str, Any] | None = None,
        pull_batch_size: int = 32,
        consume_batch_size: int = 1,
        consume_threads: int = 20,
        pull_threshold_count: int = 1000,
        pull_threshold_size_mib: int = 100,
        suspend_s: float = 15.0,
        rebalance_interval_s: float = 20.0,
        persist_interval_s: float = 5.0,
        max_reconsume_times: int = 16,
        retry_delay_level: int = 0,
        orderly_suspend_s: float = 1.0,
        pull_error_delay_s: float = 3.0,
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
        self.consume_from = parse_consume_from(consume_from)
        self.consume_timestamp_ms = consume_timestamp_ms or int((time.time() - 1800) * 1000)
        self.instance = instance or ClientInstance(namesrv, **instance_options)
        self.manager = self.instance.manager
        self.rebalancer = Rebalancer(
            self.instance,
            group,
            message_model,
            self.manager.create("allocate", allocate, options=allocate_options),
        )
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = consume_batch_size
        self.pull_threshold_count = pull_threshold_count
        self.pull_threshold_size = pull_threshold_size_mib * 1024 * 1024
        self.suspend_s = suspend_s
        self.rebalance_interval_s = rebalance_interval_s
        self.persist_interval_s = persist_interval_s
        self.max_reconsume_times = max_reconsume_times
        self.retry_delay_level = retry_delay_level
        self.orderly_suspend_s = orderly_suspend_s
        self.pull_error_delay_s = pull_error_delay_s
        #: HA (issue 7): the broker id each queue's next pull goes to (the last suggestWhichBrokerId).
        self._pull_from: dict[MessageQueue, int] = {}
        self.offset_store: OffsetStore = consumer_offset_store(
            self.instance, group, message_model, offset_dir
        )
        self.subscriptions: dict[str, Subscription] = {}
        self.listener: Listener | None = None
        self.orderly = False
        self._executor = ThreadPoolExecutor(
            max_workers=consume_threads, thread_name_prefix=f"tidemq-consume-{group}"
        )
        self._consume_slots = asyncio.Semaphore(consume_threads)
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._consume_tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._rebalance_wakeup = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._short_of_wanted = False
        self._running = False
        #: Pull/consume RT and TPS per topic, for operators (GET_CONSUMER_RUNNING_INFO).
        self.stats = diagnostics.ConsumeStats()
        self.started_at_ms = 0
        #: Message trace (docs/trace.md): ``None`` unless ``enable_msg_trace``.
        self.tracer = make_tracer(
            group, "CONSUME", self.instance, enable_msg_trace, trace_topic, trace_queue_size
        )

    # ------------------------------------------------------------------ configuration
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Consume ``topic`` messages matching ``expression`` (``*``, ``TagA || TagB`` or SQL92)."""
        self.subscriptions[topic] = Subscription.build(topic, expression, expression_type)

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        """Concurrent listener by default; ``orderly=True`` consumes each queue in order, one batch at a time."""
        self.listener = listener
        self.orderly = orderly

    # ------------------------------------------------------------------ member protocol
    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": self.message_model,
            "consumeFromWhere": self.consume_from.value,
            "subscriptionDataSet": [s.to_json() for s in self.subscriptions.values()],
            "unitMode": False,
        }

    def topics(self) -> set[str]:
        return set(self.subscriptions)

    def request_rebalance(self) -> None:
        self._rebalance_wakeup.set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._running:
            return
        if self.listener is None:
            raise ClientError("register a listener before starting the consumer")
        if not self.subscriptions:
            raise ClientError("subscribe to at least one topic before starting the consumer")
        if self.message_model == CLUSTERING:
            # Failed messages come back through the group's retry topic.
            self.subscriptions.setdefault(
                retry_topic(self.group), Subscription.build(retry_topic(self.group), "*")
            )
        await self.instance.start()
        self.instance.register_consumer(self)
        await self.offset_store.load()
        if self.tracer is not None:
            await self.tracer.start()
        self._running = True
        self.started_at_ms = int(time.time() * 1000)
        self._stopping.clear()
        for topic in self.subscriptions:
            try:
                await self.instance.get_route(topic, refresh=True)
            except Exception as exc:
                log.warning("route of %s not found yet: %s", topic, exc)
        await self.instance.send_heartbeats()
        self._loops = [
            asyncio.create_task(self._rebalance_loop()),
            asyncio.create_task(run_every(self.persist_interval_s, self.persist_offsets, "offset persist")),
        ]
        if self.orderly and self.message_model == CLUSTERING:
            self._loops.append(asyncio.create_task(run_every(20.0, self._lock_all, "queue lock renewal")))
        await self.rebalance()
        log.info("push consumer %s started as %s", self.group, self.instance.client_id)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop pulling, let in-flight messages finish, commit offsets, unlock and unregister."""
        if not self._running:
            return
        self._running = False
        self._stopping.set()
        for task in self._loops:
            task.cancel()
        for task in self._pull_tasks.values():
            task.cancel()
        await asyncio.gather(*self._loops, *self._pull_tasks.values(), return_exceptions=True)
        if self._consume_tasks:
            await asyncio.wait(set(self._consume_tasks), timeout=timeout)
        await self.persist_offsets()
        if self.orderly and self.message_model == CLUSTERING:
            await self._unlock(list(self.process_queues))
        for pq in self.process_queues.values():
            pq.dropped = True
        self.process_queues.clear()
        self._pull_tasks.clear()
        if self.tracer is not None:
            await self.tracer.shutdown()
        self.instance.unregister(self)
        await self.instance.unregister_everywhere(consumer_group=self.group)
        await self.instance.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        log.info("push consumer %s stopped", self.group)

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ rebalance
    async def _rebalance_loop(self) -> None:
        while True:
            # A topic without a route yet (consumer started before the first send) is retried soon.
            interval = (
                min(1.0, self.rebalance_interval_s)
                if self.rebalancer.incomplete or self._short_of_wanted
                else self.rebalance_interval_s
            )
            await wait_event(self._rebalance_wakeup, interval)
            if not self._running:
                # Found by the HA failover test (issue 7): CPython 3.11's wait_for can swallow a
                # cancel that races with the wake-up event (gh-86296); without this the loop
                # never ends and shutdown() hangs.
                return
            self._rebalance_wakeup.clear()
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)

    async def rebalance(self) -> None:
        """Bring the assigned queues in line with the allocation strategy's answer."""
        async with self._rebalance_lock:
            if not self._running:
                return
            wanted = await self.rebalancer.wanted(list(self.subscriptions))
            changed = False
            for mq in list(self.process_queues):
                if mq.topic in wanted and mq not in wanted[mq.topic]:
                    await self._remove_queue(mq)
                    changed = True
            for mqs in wanted.values():
                for mq in sorted(mqs):
                    if mq not in self.process_queues and await self._add_queue(mq):
                        changed = True
            # A queue we could not take yet (its previous owner still holds the lock): retry soon.
            self._short_of_wanted = any(
                mq not in self.process_queues for mqs in wanted.values() for mq in mqs
            )
            if changed:
                log.info(
                    "consumer %s of %s now owns %d queues",
                    self.instance.client_id,
                    self.group,
                    len(self.process_queues),
                )
                await self.instance.send_heartbeats()

    async def _add_queue(self, mq: MessageQueue) -> bool:
        if self.orderly and self.message_model == CLUSTERING:
            if not await self._lock([mq]):
                return False
        try:
            offset = await self._initial_offset(mq)
        except Exception as exc:
            log.warning("cannot compute the start offset of %s: %s", mq, exc)
            return False
        pq = self.process_queues.get(mq) or ProcessQueue()
        if self.orderly and self.message_model == CLUSTERING:
            pq.locked, pq.last_lock_time = True, time.monotonic()
        self.process_queues[mq] = pq
        self.offset_store.update(mq, offset, increase_only=False)
        self._pull_tasks[mq] = asyncio.create_task(self._pull_loop(mq, pq, offset))
        if self.orderly:
            self._track(asyncio.create_task(self._orderly_loop(mq, pq)))
        return True

    async def _remove_queue(self, mq: MessageQueue) -> None:
        pq = self.process_queues.pop(mq)
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        orderly = self.orderly and self.message_model == CLUSTERING
        if orderly:
            # Let the batch in the listener finish and commit before another consumer may lock the queue.
            try:
                await asyncio.wait_for(pq.consume_lock.acquire(), 10.0)
            except TimeoutError:
                log.warning("orderly batch of %s still running after 10 s; giving the queue up anyway", mq)
        pq.dropped = True
        pq.wakeup.set()
        await self.offset_store.persist([mq])
        self.offset_store.remove(mq)
        if orderly:
            await self._unlock([mq])

    async def _initial_offset(self, mq: MessageQueue) -> int:
        """RocketMQ's computePullFromWhere: the committed offset, else by ``consume_from``."""
        committed = await self.offset_store.read(mq, from_store=True)
        if committed >= 0:
            return committed
        api = self.instance.require_api()
        # HA (issue 7): with the master gone, a slave answers offset queries.
        addr = self.instance.broker_address(mq.broker_name) or self.instance.read_address(mq.broker_name)
        if addr is None:
            raise ClientError(f"broker {mq.broker_name} has no known master")
        if self.consume_from is ConsumeFrom.FIRST_OFFSET or mq.topic.startswith(RETRY_PREFIX):
            return 0 if mq.topic.startswith(RETRY_PREFIX) else await api.get_min_offset(addr, mq)
        if self.consume_from is ConsumeFrom.TIMESTAMP:
            return await api.search_offset(addr, mq, self.consume_timestamp_ms)
        return await api.get_max_offset(addr, mq)

    def _by_broker(self, mqs: list[MessageQueue]) -> Iterator[tuple[str, str, list[MessageQueue]]]:
        """``mqs`` by broker name: (name, its master's address, its queues), for the brokers
        whose address is known when their turn comes (a LOCK/UNLOCK_BATCH_MQ each)."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        for broker, queues in by_broker.items():
            addr = self.instance.broker_address(broker)
            if addr is not None:
                yield broker, addr, queues

    async def _lock(self, mqs: list[MessageQueue]) -> bool:
        """LOCK_BATCH_MQ on the queues' brokers; True when all of ``mqs`` are ours."""
        got: set[MessageQueue] = set()
        for broker, addr, queues in self._by_broker(mqs):
            try:
                got |= await self.instance.require_api().lock_batch(
                    addr, self.group, self.instance.client_id, queues
                )
            except Exception as exc:
                log.warning("locking queues on %s failed: %s", broker, exc)
        now = time.monotonic()
        for mq in mqs:
            pq = self.process_queues.get(mq)
            if pq is not None:
                pq.locked = mq in got
                if pq.locked:
                    pq.last_lock_time = now
        return set(mqs) <= got

    async def _lock_all(self) -> None:
        if self.process_queues:
            await self._lock(list(self.process_queues))

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        for broker, addr, queues in self._by_broker(mqs):
            try:
                await self.instance.require_api().unlock_batch(
                    addr, self.group, self.instance.client_id, queues
                )
            except Exception as exc:
                log.info("unlocking queues on %s failed: %s", broker, exc)

    # ------------------------------------------------------------------ pulling
    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        api = self.instance.require_api()
        sub = self.subscriptions[mq.topic]
        while self._running and not pq.dropped:
            if pq.msg_count > self.pull_threshold_count or pq.msg_size > self.pull_threshold_size:
                await asyncio.sleep(0.05)  # flow control: let the listener catch up
                continue
            if self.orderly and self.message_model == CLUSTERING and (not pq.locked or pq.lock_expired()):
                await asyncio.sleep(0.5)
                continue
            # HA (issue 7): pull from the broker id the last answer suggested, failing over to a slave.
            addr = self.instance.read_address(mq.broker_name, self._pull_from.get(mq, 0))
            sys_flag = PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
            commit = 0
            if self.message_model == CLUSTERING:
                committed = self.offset_store.table.get(mq)  # type: ignore[attr-defined]
                if committed is not None and committed > 0:
                    sys_flag |= PULL_FLAG_COMMIT_OFFSET
                    commit = committed
            try:
                if addr is None:
                    raise ClientError(f"broker {mq.broker_name} has no known master")
                pq.last_pull_time = time.monotonic()
                result = await api.pull(
                    addr,
                    group=self.group,
                    mq=mq,
                    offset=offset,
                    max_nums=self.pull_batch_size,
                    sys_flag=sys_flag,
                    commit_offset=commit,
                    suspend_ms=int(self.suspend_s * 1000),
                    subscription=sub.expression,
                    sub_version=sub.version,
                    expression_type=sub.expression_type,
                    timeout=self.suspend_s + 5.0,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._running and not pq.dropped:
                    log.warning("pull of %s at %d failed: %s", mq, offset, exc)
                    if addr is not None and isinstance(exc, RemotingError | OSError | TimeoutError):
                        self.instance.mark_down(addr)  # HA (issue 7): try the broker's other replica
                    self._pull_from.pop(mq, None)  # HA (issue 7): after a failure, back to the master
                    await asyncio.sleep(self.pull_error_delay_s)
                continue
            if pq.dropped:
                return
            self._pull_from[mq] = result.suggest_broker_id  # HA (issue 7): RocketMQ's pullFromWhichNode
            self.stats.pulled(mq.topic, len(result.messages), (time.monotonic() - pq.last_pull_time) * 1000)
            if result.status is PullStatus.FOUND:
                msgs = prepare(result.messages, sub, self.group)
                offset = result.next_begin_offset
                if msgs:
                    pq.put(msgs)
                    if not self.orderly:
                        self._dispatch_concurrently(mq, pq, msgs)
                elif pq.msg_count == 0:
                    self.offset_store.update(mq, offset)
                    pq.max_offset = max(pq.max_offset, offset - 1)
            elif result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG):
                stuck = result.status is PullStatus.NO_MATCHED_MSG and result.next_begin_offset == offset
                offset = result.next_begin_offset
                if pq.msg_count == 0:
                    self.offset_store.update(mq, offset)
                    pq.max_offset = max(pq.max_offset, offset - 1)
                if stuck:
                    await asyncio.sleep(RETRY_PAUSE_S)
            else:  # OFFSET_ILLEGAL: jump to where the broker says the queue now starts
                log.warning("offset %d of %s is illegal; moving to %d", offset, mq, result.next_begin_offset)
                offset = result.next_begin_offset
                self.offset_store.update(mq, offset, increase_only=False)
                pq.max_offset = offset - 1
                await self.offset_store.persist([mq])

    # ------------------------------------------------------------------ consuming
    def _track(self, task: asyncio.Task[Any]) -> None:
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)

    def _dispatch_concurrently(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        for i in range(0, len(msgs), self.consume_batch_size):
            self._track(
                asyncio.create_task(self._consume_concurrently(mq, pq, msgs[i : i + self.consume_batch_size]))
            )

    async def _call_listener(self, mq: MessageQueue, msgs: list[MessageExt]) -> bool:
        assert self.listener is not None
        ctx = ConsumeContext(
            side="client",
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=msgs[0].queue_offset,
            client_address=self.instance.client_id,
            message_count=len(msgs),
        )
        self.manager.hook.tidemq_before_consume(context=ctx)
        before, raised = self.tracer.sub_before(msgs) if self.tracer is not None else None, False
        now_ms = str(int(time.time() * 1000))
        for m in msgs:
            m.properties[Prop.CONSUME_START_TIMESTAMP] = now_ms
        begin = time.monotonic()
        try:
            if inspect.iscoroutinefunction(self.listener):
                result = await self.listener(msgs)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._executor, self.listener, msgs)
            ok = _ok(result)
        except Exception:
            log.exception("listener of %s failed on %d message(s) of %s", self.group, len(msgs), mq)
            ok, raised = False, True
        if self.tracer is not None:
            self.tracer.sub_after(before, len(msgs), ok, raised)
        ctx.elapsed_ms = (time.monotonic() - begin) * 1000
        self.stats.consumed(mq.topic, len(msgs), ctx.elapsed_ms, ok)
        ctx.status = ConsumeStatus.SUCCESS.value if ok else ConsumeStatus.RECONSUME_LATER.value
        self.manager.hook.tidemq_after_consume(context=ctx)
        return ok

    async def _consume_concurrently(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        async with self._consume_slots:
            if pq.dropped:
                return
            ok = await self._call_listener(mq, msgs)
        if pq.dropped:
            return  # the queue moved to another consumer; it restarts from the committed offset
        retry_locally: list[MessageExt] = []
        if not ok:
            if self.message_model == BROADCASTING:
                log.warning(
                    "broadcast consume of %d message(s) failed; dropped (no retry in broadcasting)", len(msgs)
                )
            else:
                for m in msgs:
                    if not await self._send_back(m, self.retry_delay_level):
                        retry_locally.append(m)
        done = [m for m in msgs if m not in retry_locally]
        self.offset_store.update(mq, pq.remove(done))
        if retry_locally:
            # The broker did not take them back: consume again here a little later (consumeMessageLater).
            async def later() -> None:
                if await wait_event(self._stopping, 5.0):
                    return  # shutting down: left uncommitted, so consumed again after a restart
                if not pq.dropped and self._running:
                    await self._consume_concurrently(mq, pq, retry_locally)

            self._track(asyncio.create_task(later()))

    async def _send_back(self, msg: MessageExt, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK: the broker schedules a retry (or moves it to the DLQ after the maximum)."""
        addr = self._address_of(msg)
        if addr is None:
            return False
        try:
            await self.instance.require_api().send_back(
                addr,
                group=self.group,
                commit_log_offset=msg.commit_log_offset,
                delay_level=delay_level,
                origin_msg_id=msg.uniq_key or msg.msg_id,
                origin_topic=msg.topic,
                max_reconsume_times=self.max_reconsume_times,
            )
            return True
        except Exception as exc:
            log.warning("sending message %s back for retry failed: %s", msg.uniq_key or msg.msg_id, exc)
            return False

    def _address_of(self, msg: MessageExt) -> str | None:
        """The master that stored ``msg``: its store host, when it is one of the known masters."""
        store = f"{msg.store_host[0]}:{msg.store_host[1]}"
        masters = self.instance.master_addresses()
        if store in masters:
            return store
        for mq in self.process_queues:
            if mq.topic in (msg.topic, retry_topic(self.group)) and mq.queue_id == msg.queue_id:
                return self.instance.broker_address(mq.broker_name)
        return masters[0] if masters else None

    async def _orderly_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        while self._running and not pq.dropped:
            if not pq.msgs:
                pq.wakeup.clear()
                await wait_event(pq.wakeup, 1.0)
                continue
            if self.message_model == CLUSTERING and (not pq.locked or pq.lock_expired()):
                await asyncio.sleep(0.1)
                continue
            suspend = False
            # Commit or roll back under the queue's consume lock: a rebalance that takes the queue
            # away waits for it, so the next owner starts exactly after the last finished batch.
            async with pq.consume_lock, self._consume_slots:
                if pq.dropped:
                    return
                batch = pq.take(self.consume_batch_size)
                ok = await self._call_listener(mq, batch)
                exhausted = any(m.reconsume_times + 1 >= self.max_reconsume_times for m in batch)
                if ok:
                    self.offset_store.update(mq, pq.commit())
                elif exhausted and self.message_model == CLUSTERING:
                    # Out of local retries: delay level -1 sends them straight to the dead-letter queue.
                    for m in batch:
                        await self._send_back(m, -1)
                    self.offset_store.update(mq, pq.commit())
                else:
                    for m in batch:
                        m.reconsume_times += 1
                    pq.rollback()
                    suspend = True
            if suspend:
                await asyncio.sleep(self.orderly_suspend_s)

    # ------------------------------------------------------------------ offsets
    async def persist_offsets(self) -> None:
        await self.offset_store.persist(list(self.process_queues))

    def assigned_queues(self) -> list[MessageQueue]:
        return sorted(self.process_queues)

    # ------------------------------------------------------------------ operators (via the broker)
    async def reset_offset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: drop the topic's queues (and what they cached), commit the
        given offsets, then let the rebalance take the queues again from there."""
        async with self._rebalance_lock:
            for mq in [q for q in self.process_queues if q.topic == topic]:
                pq = self.process_queues.pop(mq)
                task = self._pull_tasks.pop(mq, None)
                if task is not None:
                    task.cancel()
                pq.dropped = True
                pq.wakeup.set()
            mqs = [mq for mq in table if mq.topic == topic]
            for mq in mqs:
                self.offset_store.update(mq, table[mq], increase_only=False)
            await self.offset_store.persist(mqs)
            for mq in mqs:
                self.offset_store.remove(mq)
        log.info("offsets of %s reset by an operator for %s; rebalancing", topic, self.group)
        self.request_rebalance()

    def consumer_status(self, topic: str) -> dict[MessageQueue, int]:
        """GET_CONSUMER_STATUS_FROM_CLIENT: the offsets held for ``topic`` (cloneOffsetTable)."""
        table: dict[MessageQueue, int] = self.offset_store.table  # type: ignore[attr-defined]
        return {mq: off for mq, off in table.items() if mq.topic == topic}

    def running_info(self, with_jstack: bool = False) -> dict[str, Any]:
        """ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO)."""
        table: dict[MessageQueue, int] = self.offset_store.table  # type: ignore[attr-defined]
        props = {
            "consumerGroup": self.group,
            "messageModel": self.message_model,
            "consumeFromWhere": self.consume_from.value,
            "consumeTimestamp": self.consume_timestamp_ms,
            "pullBatchSize": self.pull_batch_size,
            "consumeMessageBatchMaxSize": self.consume_batch_size,
            "pullThresholdForQueue": self.pull_threshold_count,
            "pullThresholdSizeForQueue": self.pull_threshold_size // (1024 * 1024),
            "maxReconsumeTimes": self.max_reconsume_times,
            "instanceName": self.instance.instance_name,
            "clientIP": self.instance.ip,
            "PROP_CONSUMEORDERLY": str(self.orderly).lower(),
            "PROP_THREADPOOL_CORE_SIZE": self._executor._max_workers,
            "PROP_CONSUMER_START_TIMESTAMP": self.started_at_ms,
        }
        return diagnostics.running_info(
            properties=props,
            subscriptions=[s.to_json() for s in self.subscriptions.values()],
            mq_table={
                mq: diagnostics.process_queue_info(table.get(mq, -1), pq)
                for mq, pq in self.process_queues.items()
            },
            status_table={t: self.stats.status(t) for t in self.subscriptions},
            with_jstack=with_jstack,
        )

    async def consume_message_directly(self, msg: MessageExt, broker_name: str) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY: the listener gets ``msg`` now, outside any queue; no commit."""
        assert self.listener is not None
        prepare([msg], None, self.group)  # a retried message shows its original topic

        def run_sync(fn: Callable[[list[MessageExt]], Any], msgs: list[MessageExt]) -> Any:
            return asyncio.get_running_loop().run_in_executor(self._executor, fn, msgs)

        return await diagnostics.consume_directly(self.listener, msg, orderly=self.orderly, run_sync=run_sync)
