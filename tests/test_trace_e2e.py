"""Message trace end to end: tracing clients against real brokers on loopback.

broker-a holds the default trace topic, broker-b a custom one (``msg_trace_topic_name``); both
refuse to auto-create topics, so a client tracing to a topic no broker has fails its trace sends.
Trace messages are found as ``tidemq admin queryMsgTraceById`` finds them: QUERY_MESSAGE by key
(the traced message id) on the trace topic, bodies decoded with :mod:`tidemq.trace`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_client_e2e import Cluster, create_topic, push_consumer, unique, wait_route

from tidemq import hookimpl
from tidemq.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    SendStatus,
    TransactionProducer,
)
from tidemq.client.admin import AdminClient
from tidemq.plugins import PluginManager
from tidemq.trace import DEFAULT_TRACE_TOPIC, MessageType, TraceContext, TraceType, decode_trace_data

CUSTOM_TRACE = "CustomTraceTopic"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(tmp_path_factory.mktemp("trace"))
    try:
        c.run(c.start_namesrv())
        c.run(c.start_broker("broker-a", trace_topic_enable=True, auto_create_topic=False))
        c.run(
            c.start_broker(
                "broker-b",
                trace_topic_enable=True,
                msg_trace_topic_name=CUSTOM_TRACE,
                auto_create_topic=False,
            )
        )
        c.run(wait_route(c.ns, DEFAULT_TRACE_TOPIC))
        c.run(wait_route(c.ns, CUSTOM_TRACE))
        yield c
    finally:
        c.run(c.stop())
        c.loop.stop()


async def new_topic(cluster: Cluster) -> str:
    topic = unique("TraceT")
    await create_topic(cluster.ns, cluster.brokers["broker-a"].address, topic, queues=2)
    await wait_route(cluster.ns, topic)
    return topic


async def traces(
    ns: str, trace_topic: str, msg_id: str, want: set[TraceType], timeout: float = 10.0, key: str = ""
) -> list[TraceContext]:
    """The decoded trace contexts of ``msg_id`` (queried by ``key``, default the id) once every
    type in ``want`` is there."""
    admin = AdminClient(ns)
    try:
        deadline = time.monotonic() + timeout
        while True:
            found = [
                ctx
                for m in await admin.query_messages(trace_topic, key or msg_id)
                for ctx in decode_trace_data(m.body.decode())
                if ctx.beans[0].msg_id == msg_id
            ]
            if want <= {c.trace_type for c in found} or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def by_type(found: list[TraceContext], tt: TraceType) -> TraceContext:
    matches = [c for c in found if c.trace_type is tt]
    assert matches, f"no {tt.value} record among {[c.trace_type.value for c in found]}"
    return matches[0]


class Collector:
    """A real plugin implementing the trace hook."""

    def __init__(self) -> None:
        self.contexts: list[TraceContext] = []

    @hookimpl
    def tidemq_trace_dispatched(self, contexts: list[TraceContext]) -> None:
        self.contexts.extend(contexts)


def test_send_and_consume_are_found_by_message_id_on_the_trace_topic(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        manager = PluginManager()
        manager.load_entry_points()
        collector = Collector()
        manager.register(collector, name="trace-collector")
        pg, cg = unique("TracePG"), unique("TraceCG")
        async with Producer(pg, cluster.ns, enable_msg_trace=True, manager=manager) as p:
            sent = await p.send(Message(topic, b"hello", tags="TagA", keys="order-1"))
        # Shutdown flushed the queued Pub to the trace topic and the hook.
        assert [c.trace_type for c in collector.contexts] == [TraceType.PUB]
        assert collector.contexts[0].beans[0].msg_id == sent.msg_id

        got: list[MessageExt] = []
        c = push_consumer(cluster.ns, cg, topic, enable_msg_trace=True)
        c.register_listener(lambda msgs: got.extend(msgs))
        await c.start()
        try:
            found = await traces(
                cluster.ns, DEFAULT_TRACE_TOPIC, sent.msg_id, set(TraceType) - {TraceType.END_TRANSACTION}
            )
        finally:
            await c.shutdown()
        assert [m.uniq_key for m in got] == [sent.msg_id]

        pub = by_type(found, TraceType.PUB)
        assert (pub.group_name, pub.is_success, pub.region_id) == (pg, True, "DefaultRegion")
        assert 0 <= pub.cost_time < 5000
        bean = pub.beans[0]
        assert (bean.topic, bean.tags, bean.keys, bean.body_length) == (topic, "TagA", "order-1", 5)
        assert bean.store_host == sent.broker_address and bean.offset_msg_id == sent.offset_msg_id
        assert bean.msg_type is MessageType.NORMAL
        before, after = by_type(found, TraceType.SUB_BEFORE), by_type(found, TraceType.SUB_AFTER)
        assert before.group_name == cg and before.beans[0].retry_times == 0
        assert after.request_id == before.request_id and after.is_success and after.context_code == 0
        # The traced message's own key finds the Pub too.
        by_key = await traces(cluster.ns, DEFAULT_TRACE_TOPIC, sent.msg_id, {TraceType.PUB}, key="order-1")
        assert by_type(by_key, TraceType.PUB) == pub

    cluster.run(main())


def test_custom_trace_topic(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with Producer(
            unique("TracePG"), cluster.ns, enable_msg_trace=True, trace_topic=CUSTOM_TRACE
        ) as p:
            sent = await p.send(Message(topic, b"x"))
        found = await traces(cluster.ns, CUSTOM_TRACE, sent.msg_id, {TraceType.PUB})
        assert by_type(found, TraceType.PUB).beans[0].topic == topic
        admin = AdminClient(cluster.ns)
        try:
            assert not await admin.query_messages(DEFAULT_TRACE_TOPIC, sent.msg_id)
        finally:
            await admin.close()

    cluster.run(main())


class Commit:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


def test_transaction_records_half_send_and_end_transaction(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        group = unique("TraceTxPG")
        async with TransactionProducer(group, Commit(), cluster.ns, enable_msg_trace=True) as p:
            result = await p.send_in_transaction(Message(topic, b"tx", keys="tx-key"))
        msg_id = result.msg_id
        found = await traces(
            cluster.ns, DEFAULT_TRACE_TOPIC, msg_id, {TraceType.PUB, TraceType.END_TRANSACTION}
        )
        assert by_type(found, TraceType.PUB).beans[0].msg_type is MessageType.TRANS_HALF
        end = by_type(found, TraceType.END_TRANSACTION)
        assert end.group_name == group
        bean = end.beans[0]
        assert (bean.transaction_state, bean.transaction_id, bean.from_transaction_check) == (
            "COMMIT_MESSAGE",
            msg_id,
            False,
        )
        assert (bean.topic, bean.keys, bean.msg_type) == (topic, "tx-key", MessageType.TRANS_COMMIT)

    cluster.run(main())


def test_a_full_trace_queue_drops_and_never_fails_a_send(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with Producer(unique("TracePG"), cluster.ns, enable_msg_trace=True, trace_queue_size=1) as p:
            assert p.tracer is not None
            results = await asyncio.gather(*(p.send(Message(topic, b"%d" % i)) for i in range(40)))
            assert all(r.status is SendStatus.SEND_OK for r in results)
            dispatcher = p.tracer.dispatcher
        assert dispatcher.dropped > 0
        assert dispatcher.dropped + dispatcher.sent == 40 and dispatcher.failed == 0

    cluster.run(main())


def test_no_trace_topic_on_any_broker_fails_only_the_traces(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with Producer(
            unique("TracePG"), cluster.ns, enable_msg_trace=True, trace_topic="NoSuchTrace"
        ) as p:
            assert p.tracer is not None
            for i in range(3):
                assert (await p.send(Message(topic, b"%d" % i))).status is SendStatus.SEND_OK
            dispatcher = p.tracer.dispatcher
        assert dispatcher.failed == 3 and dispatcher.sent == 0 and dispatcher.dropped == 0

    cluster.run(main())


def test_tracing_is_off_by_default() -> None:
    assert Producer("pg").tracer is None


def test_a_failed_consume_is_traced_with_its_return_type(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with Producer(unique("TracePG"), cluster.ns) as p:
            failed = await p.send(Message(topic, b"fail"))
            raised = await p.send(Message(topic, b"raise"))

        def listener(msgs: list[MessageExt]) -> bool:
            if msgs[0].body == b"raise":
                raise RuntimeError("listener failed")
            return False

        c = push_consumer(cluster.ns, unique("TraceCG"), topic, enable_msg_trace=True)
        c.register_listener(listener)
        await c.start()
        try:
            want = {TraceType.SUB_BEFORE, TraceType.SUB_AFTER}
            found_failed = await traces(cluster.ns, DEFAULT_TRACE_TOPIC, failed.msg_id, want)
            found_raised = await traces(cluster.ns, DEFAULT_TRACE_TOPIC, raised.msg_id, want)
        finally:
            await c.shutdown()
        # The producer does not trace: only the consumer's records are there.
        assert {ctx.trace_type for ctx in found_failed} == want
        after = by_type(found_failed, TraceType.SUB_AFTER)
        assert (after.is_success, after.context_code) == (False, 4)  # ConsumeReturnType.FAILED
        after = by_type(found_raised, TraceType.SUB_AFTER)
        assert (after.is_success, after.context_code) == (False, 2)  # ConsumeReturnType.EXCEPTION

    cluster.run(main())


class Broken:
    @hookimpl
    def tidemq_trace_dispatched(self, contexts: list[TraceContext]) -> None:
        raise RuntimeError("exporter down")


def test_a_failing_exporter_plugin_loses_no_trace(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        manager = PluginManager()
        manager.load_entry_points()
        manager.register(Broken(), name="broken-exporter")
        async with Producer(unique("TracePG"), cluster.ns, enable_msg_trace=True, manager=manager) as p:
            sent = await p.send(Message(topic, b"x"))
        assert by_type(
            await traces(cluster.ns, DEFAULT_TRACE_TOPIC, sent.msg_id, {TraceType.PUB}), TraceType.PUB
        )

    cluster.run(main())


def test_a_pull_consumer_poll_is_traced_like_the_lite_pull_consumer(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        pg, cg = unique("TracePullPG"), unique("TracePullCG")
        async with Producer(pg, cluster.ns) as p:
            sent = await p.send(Message(topic, b"polled", keys="poll-1"))
        async with PullConsumer(cg, cluster.ns, enable_msg_trace=True) as c:
            mqs = await c.fetch_subscribe_queues(topic)
            await c.assign(mqs)
            got: list[MessageExt] = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = await c.poll(timeout=0.5)
        assert [m.uniq_key for m in got] == [sent.msg_id]
        found = await traces(
            cluster.ns, DEFAULT_TRACE_TOPIC, sent.msg_id, {TraceType.SUB_BEFORE, TraceType.SUB_AFTER}
        )
        before, after = by_type(found, TraceType.SUB_BEFORE), by_type(found, TraceType.SUB_AFTER)
        assert before.group_name == cg and after.group_name == cg
        assert after.request_id == before.request_id and after.is_success

    cluster.run(main())
