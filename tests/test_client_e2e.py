"""tidemq's client against a real NameServer and broker(s) on loopback.

The cluster runs in-process on a background event loop (the client's own LoopThread); tests
drive the asyncio client on that loop with ``run(...)``.  Each test uses its own topic and group.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tidemq import hookimpl
from tidemq.client import (
    BROADCASTING,
    AdminClient,
    BlockingProducer,
    BlockingPushConsumer,
    BoundaryType,
    ClientInstance,
    ConsumeStatus,
    LoopThread,
    Message,
    MessageExt,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
    SendStatus,
)
from tidemq.plugins import get_plugin_manager

broker_mod = pytest.importorskip("tidemq.broker")


def _namesrv_class() -> Any:
    namesrv = pytest.importorskip("tidemq.namesrv")
    return namesrv.NameServer


_seq = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid()}_{next(_seq)}"


T = Any  # what a coroutine run on the cluster loop returns


class Cluster:
    """A NameServer and brokers on free loopback ports, on a background loop."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = LoopThread("tidemq-test-cluster")
        self.namesrv: Any = None
        self.brokers: dict[str, Any] = {}

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return self.loop.run(coro, timeout)

    async def start_namesrv(self) -> None:
        from tidemq.config import NamesrvSettings

        cls = _namesrv_class()
        transport = get_plugin_manager().create("transport", "tcp")
        self.namesrv = cls(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(self.tmp / "namesrv")), transport
        )
        await self.namesrv.start()

    @property
    def ns(self) -> str:
        return self.namesrv.address

    async def start_broker(self, name: str, **settings: Any) -> Any:
        from tidemq.config import compose, parse_config

        cfg = parse_config(
            {
                "broker": {
                    "name": name,
                    "listen": "127.0.0.1:0",
                    "namesrv": [self.ns],
                    "data_dir": str(self.tmp / name),
                    **settings,
                },
                "store": {"mmap": {"commitlog_file_size": 8 * 1024 * 1024, "consumequeue_entries": 10000}},
            }
        )
        broker = broker_mod.Broker(compose(cfg))
        await broker.start()
        self.brokers[name] = broker
        return broker

    async def stop(self) -> None:
        for b in self.brokers.values():
            try:
                await b.stop()
            except Exception:
                pass
        if self.namesrv is not None:
            await self.namesrv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.run(c.start_namesrv())
        c.run(c.start_broker("broker-a"))
        yield c
    finally:
        c.run(c.stop())
        c.loop.stop()


async def create_topic(instance_ns: str, broker_addr: str, topic: str, queues: int = 4) -> None:
    """UPDATE_AND_CREATE_TOPIC on one broker (what `mqadmin updateTopic` sends)."""
    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        fields = {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": queues,
            "writeQueueNums": queues,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": "false",
        }
        resp = await client.invoke(
            broker_addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields), 5.0
        )
        assert resp.code == ResponseCode.SUCCESS, resp
    finally:
        await client.close()


async def wait_for(cond: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_route(ns: str, topic: str, brokers: int = 1, timeout: float = 15.0) -> None:
    """Until the NameServer lists ``topic`` on ``brokers`` brokers."""
    inst = ClientInstance(ns)
    await inst.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            route = await inst.require_api().get_route(topic)
            if (
                route is not None
                and len(route.publish_queues())
                and len({q.broker_name for q in route.publish_queues()}) >= brokers
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"route of {topic} not on {brokers} brokers")
            await asyncio.sleep(0.1)
    finally:
        await inst.stop()


def push_consumer(ns: str, group: str, topic: str, expression: str = "*", **kw: Any) -> PushConsumer:
    kw.setdefault("consume_from", "first")
    kw.setdefault("suspend_s", 1.0)
    kw.setdefault("pull_error_delay_s", 0.2)
    c = PushConsumer(group, ns, **kw)
    c.subscribe(topic, expression)
    return c


# ---------------------------------------------------------------------------- sends + pull


def test_every_send_kind_is_pulled_back_intact(cluster: Cluster) -> None:
    topic = unique("SendKinds")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            results = []
            results.append(
                await p.send(
                    Message(topic, b"sync", tags="TagA", keys=["k1", "k2"], properties={"color": "red"})
                )
            )
            done = asyncio.Event()
            seen: list[Any] = []
            task = p.send_async(
                Message(topic, b"async", tags="TagB"), lambda r, e: (seen.append((r, e)), done.set())
            )
            results.append(await task)
            await done.wait()
            assert seen[0][1] is None and seen[0][0] == results[-1]
            await p.send_oneway(Message(topic, b"oneway", tags="TagC"))
            batch = await p.send_batch(
                [Message(topic, b"batch-%d" % i, keys=f"bk{i}", properties={"i": str(i)}) for i in range(5)]
            )
            assert len(batch.msg_id.split(",")) == 5
            ordered = await p.send_orderly(Message(topic, b"ordered", tags="TagO"), "order-42")
            again = await p.send_orderly(Message(topic, b"ordered-2", tags="TagO"), "order-42")
            assert ordered.queue == again.queue  # same sharding key, same queue
            queues = await p.publish_queues(topic)
            pinned = await p.send_batch_to_queue(
                [Message(topic, b"pinned-%d" % i) for i in range(3)], queues[2]
            )
            assert pinned.queue == queues[2]
            assert all(r.status is SendStatus.SEND_OK for r in [*results, batch, ordered, pinned])

        async with PullConsumer(unique("CG"), cluster.ns) as c:
            queues = await c.fetch_subscribe_queues(topic)
            assert len(queues) == 4
            got: list[MessageExt] = []
            for mq in queues:
                res = await c.pull(mq, "*", 0, 32)
                assert res.status in (PullStatus.FOUND, PullStatus.NO_NEW_MSG)
                got.extend(res.messages)
                if res.messages:
                    assert res.next_begin_offset == res.messages[-1].queue_offset + 1
        by_body = {m.body: m for m in got}
        assert set(by_body) == {
            b"sync",
            b"async",
            b"oneway",
            b"ordered",
            b"ordered-2",
            *(b"batch-%d" % i for i in range(5)),
            *(b"pinned-%d" % i for i in range(3)),
        }
        # The batch sent to one queue is stored there, in order.
        pinned_msgs = [by_body[b"pinned-%d" % i] for i in range(3)]
        assert {m.queue_id for m in pinned_msgs} == {queues[2].queue_id}  # one broker here
        assert [m.queue_offset for m in pinned_msgs] == sorted(m.queue_offset for m in pinned_msgs)
        sync = by_body[b"sync"]
        assert sync.tags == "TagA" and sync.keys == ["k1", "k2"] and sync.properties["color"] == "red"
        assert sync.uniq_key == results[0].msg_id
        assert sync.msg_id == results[0].offset_msg_id
        assert by_body[b"batch-3"].keys == ["bk3"] and by_body[b"batch-3"].properties["i"] == "3"
        assert by_body[b"batch-3"].uniq_key == batch.msg_id.split(",")[3]

    cluster.run(main())


def test_pull_filters_by_tag_and_reports_offsets(cluster: Cluster) -> None:
    topic = unique("PullTags")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            q0 = (await p.publish_queues(topic))[0]
            for tag in ["TagA", "TagB", "TagC", "TagA"]:
                await p.send_to_queue(Message(topic, tag.encode(), tags=tag), q0)
        async with PullConsumer(unique("CG"), cluster.ns) as c:
            res = await c.pull(q0, "TagA || TagC", 0, 32)
            assert [m.body for m in res.messages] == [b"TagA", b"TagC", b"TagA"]
            assert res.max_offset == 4 and await c.max_offset(q0) == 4
            empty = await c.pull(q0, "*", 4, 32)
            assert empty.status is PullStatus.NO_NEW_MSG
            await c.update_consume_offset(q0, 3)
            assert await c.fetch_consume_offset(q0) == 3

    cluster.run(main())


def test_long_polling_pull_returns_when_a_message_arrives(cluster: Cluster) -> None:
    topic = unique("LongPoll")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            q0 = (await p.publish_queues(topic))[0]
            await p.send_to_queue(Message(topic, b"first"), q0)
            async with PullConsumer(unique("CG"), cluster.ns) as c:
                begin = time.monotonic()
                pending = asyncio.create_task(c.pull(q0, "*", 1, 32, suspend=10.0))
                await asyncio.sleep(0.3)
                await p.send_to_queue(Message(topic, b"second"), q0)
                res = await pending
                assert [m.body for m in res.messages] == [b"second"]
                assert time.monotonic() - begin < 8.0  # woken by the arrival, not the suspend timeout

    cluster.run(main())


@pytest.mark.parametrize("codec", ["zlib", "lz4", "zstd"])
def test_large_messages_are_compressed_and_consumed_intact(cluster: Cluster, codec: str) -> None:
    topic = unique("Big")
    body = b"".join(b"line %06d of a large compressible message\n" % i for i in range(20000))  # ~880 KiB

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns, compression=codec, max_message_size=256 * 1024) as p:
            r = await p.send(Message(topic, body, tags="Big"))
        got: list[bytes] = []
        c = push_consumer(cluster.ns, unique("CG"), topic)
        c.register_listener(lambda msgs: got.extend(m.body for m in msgs))
        await c.start()
        try:
            await wait_for(lambda: len(got) == 1, what="the large message")
        finally:
            await c.shutdown()
        assert got[0] == body and r.status is SendStatus.SEND_OK

    cluster.run(main())


# ---------------------------------------------------------------------------- push consumers


def test_push_consumer_gets_every_matching_message_once(cluster: Cluster) -> None:
    topic = unique("Push")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(30):
                await p.send(
                    Message(topic, b"%d" % i, tags=("TagA", "TagB", "TagC")[i % 3], properties={"n": str(i)})
                )
        got: list[MessageExt] = []

        async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            got.extend(msgs)
            return ConsumeStatus.SUCCESS

        c = push_consumer(cluster.ns, unique("CG"), topic, "TagA || TagB", consume_batch_size=4)
        c.register_listener(listener)
        await c.start()
        try:
            await wait_for(lambda: len(got) >= 20, what="20 messages")
            await asyncio.sleep(0.3)
        finally:
            await c.shutdown()
        assert sorted(int(m.body) for m in got) == [i for i in range(30) if i % 3 != 2]
        assert all(m.properties["n"] == m.body.decode() for m in got)

    cluster.run(main())


def test_flow_control_pauses_pulling_while_the_listener_lags(cluster: Cluster) -> None:
    topic = unique("Flow")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(0, 150, 10):
                await p.send_batch([Message(topic, b"%d" % n) for n in range(i, i + 10)])
        got: list[bytes] = []
        peak = 0
        c = push_consumer(
            cluster.ns, unique("CG"), topic, pull_threshold_count=20, pull_batch_size=8, consume_threads=1
        )

        def slow(msgs: list[MessageExt]) -> None:
            nonlocal peak
            peak = max(peak, max((pq.msg_count for pq in list(c.process_queues.values())), default=0))
            time.sleep(0.002)
            got.extend(m.body for m in msgs)

        c.register_listener(slow)
        await c.start()
        try:
            await wait_for(lambda: len(got) >= 150, what="150 messages")
        finally:
            await c.shutdown()
        assert sorted(got) == sorted(b"%d" % n for n in range(150))
        assert 8 <= peak <= 20 + 8  # pulling paused above 20 waiting messages (one batch may overshoot)

    cluster.run(main())


def test_group_of_two_splits_queues_and_loses_nothing(cluster: Cluster) -> None:
    topic, group = unique("Split"), unique("CG")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            await p.publish_queues(topic)
            await p.send(Message(topic, b"warmup"))
            await wait_route(cluster.ns, topic)
            got: dict[str, list[bytes]] = {"one": [], "two": []}
            # default 20 s rebalance period: joins and leaves must act through NOTIFY_CONSUMER_IDS_CHANGED
            c1 = push_consumer(cluster.ns, group, topic)
            c2 = push_consumer(cluster.ns, group, topic)
            c1.register_listener(lambda msgs: got["one"].extend(m.body for m in msgs))
            c2.register_listener(lambda msgs: got["two"].extend(m.body for m in msgs))
            await c1.start()
            await c2.start()
            try:

                def split() -> bool:
                    a = {q for q in c1.assigned_queues() if q.topic == topic}
                    b = {q for q in c2.assigned_queues() if q.topic == topic}
                    return len(a) == 2 and len(b) == 2 and not a & b

                await wait_for(split, what="two disjoint halves")
                for i in range(40):
                    await p.send(Message(topic, b"m%d" % i))
                await wait_for(lambda: len(set(got["one"]) | set(got["two"])) >= 41, what="all 41 messages")
                assert got["one"] and got["two"]  # both consumers worked
                # one consumer leaves: the other takes every queue and keeps consuming
                await c2.shutdown()
                await wait_for(
                    lambda: len([q for q in c1.assigned_queues() if q.topic == topic]) == 4, what="take-over"
                )
                for i in range(40, 60):
                    await p.send(Message(topic, b"m%d" % i))
                await wait_for(
                    lambda: len(set(got["one"]) | set(got["two"])) >= 61, what="messages after leave"
                )
            finally:
                await c1.shutdown()
                await c2.shutdown()
        everything = set(got["one"]) | set(got["two"])
        assert everything == {b"warmup", *(b"m%d" % i for i in range(60))}

    cluster.run(main())


def test_restarted_consumer_resumes_from_committed_offset(cluster: Cluster) -> None:
    topic, group = unique("Resume"), unique("CG")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(10):
                await p.send(Message(topic, b"a%d" % i))
            first: list[bytes] = []
            c = push_consumer(cluster.ns, group, topic)
            c.register_listener(lambda msgs: first.extend(m.body for m in msgs))
            await c.start()
            await wait_for(lambda: len(first) == 10, what="first 10")
            await c.shutdown()  # commits offsets
            for i in range(10):
                await p.send(Message(topic, b"b%d" % i))
            second: list[bytes] = []
            c = push_consumer(cluster.ns, group, topic)
            c.register_listener(lambda msgs: second.extend(m.body for m in msgs))
            await c.start()
            try:
                await wait_for(lambda: len(second) >= 10, what="second 10")
                await asyncio.sleep(0.5)
            finally:
                await c.shutdown()
        assert sorted(second) == sorted(b"b%d" % i for i in range(10))

    cluster.run(main())


def test_failed_messages_are_retried_then_dead_lettered(cluster: Cluster) -> None:
    topic, group = unique("Retry"), unique("CG")

    async def main() -> None:
        attempts: dict[bytes, list[MessageExt]] = {}

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            m = msgs[0]
            attempts.setdefault(m.body, []).append(m)
            if m.body == b"poison" or (m.body == b"flaky" and m.reconsume_times == 0):
                raise RuntimeError("listener failure")
            return ConsumeStatus.SUCCESS

        c = push_consumer(cluster.ns, group, topic, max_reconsume_times=2, retry_delay_level=1)
        c.register_listener(listener)
        await c.start()
        try:
            async with Producer(unique("PG"), cluster.ns) as p:
                await p.send(Message(topic, b"flaky", tags="T", keys="fk"))
                await p.send(Message(topic, b"poison"))
                await p.send(Message(topic, b"fine"))
            await wait_for(lambda: len(attempts.get(b"flaky", [])) >= 2, what="flaky retried")
            await wait_for(lambda: len(attempts.get(b"poison", [])) >= 3, what="poison retried twice")
            await asyncio.sleep(1.0)
        finally:
            await c.shutdown()
        flaky = attempts[b"flaky"]
        assert len(flaky) == 2 and flaky[1].reconsume_times == 1
        assert (
            flaky[1].topic == topic and flaky[1].tags == "T" and flaky[1].keys == ["fk"]
        )  # original topic restored
        assert len(attempts[b"fine"]) == 1
        assert len(attempts[b"poison"]) == 3  # first try + max_reconsume_times retries, then the DLQ
        # RocketMQ makes DLQ topics write-only, so look at the broker's store for the dead letter.
        store = cluster.brokers["broker-a"].store
        assert store.get_max_offset_in_queue(f"%DLQ%{group}", 0) == 1

    cluster.run(main())


def test_orderly_consumption_keeps_per_key_order(cluster: Cluster) -> None:
    topic, group = unique("Order"), unique("CG")

    async def main() -> None:
        seen: dict[str, list[int]] = {}
        failed_once: set[bytes] = set()

        def listener(msgs: list[MessageExt]) -> ConsumeStatus:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                if seq == "5" and m.body not in failed_once:  # a failure must not let later messages pass
                    failed_once.add(m.body)
                    return ConsumeStatus.RECONSUME_LATER
                seen.setdefault(key, []).append(int(seq))
            return ConsumeStatus.SUCCESS

        async with Producer(unique("PG"), cluster.ns) as p:
            for seq in range(15):
                for key in ("order-1", "order-2", "order-3"):
                    await p.send_orderly(Message(topic, f"{key}:{seq}".encode()), key)
        c = push_consumer(cluster.ns, group, topic, orderly_suspend_s=0.2)
        c.register_listener(listener, orderly=True)
        await c.start()
        try:
            await wait_for(lambda: sum(len(v) for v in seen.values()) >= 45, what="45 ordered messages")
        finally:
            await c.shutdown()
        assert seen == {k: list(range(15)) for k in ("order-1", "order-2", "order-3")}

    cluster.run(main())


def test_broadcasting_delivers_everything_to_each_consumer(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = unique("Bcast"), unique("CG")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(12):
                await p.send(Message(topic, b"%d" % i))
        got: dict[int, list[bytes]] = {0: [], 1: []}
        consumers = []
        for n in (0, 1):
            c = push_consumer(
                cluster.ns,
                group,
                topic,
                message_model=BROADCASTING,
                offset_dir=tmp_path,
                instance_name=f"bc{n}",
            )
            c.register_listener(lambda msgs, n=n: got[n].extend(m.body for m in msgs))
            consumers.append(c)
            await c.start()
        try:
            await wait_for(lambda: len(got[0]) == 12 and len(got[1]) == 12, what="both consumers get all")
        finally:
            for c in consumers:
                await c.shutdown()
        assert sorted(got[0]) == sorted(got[1]) == sorted(b"%d" % i for i in range(12))
        assert (tmp_path / "bc0" / group / "offsets.json").exists()
        # A restarted broadcasting consumer resumes from its local offsets file.
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(12, 15):
                await p.send(Message(topic, b"%d" % i))
        again: list[bytes] = []
        c = push_consumer(
            cluster.ns, group, topic, message_model=BROADCASTING, offset_dir=tmp_path, instance_name="bc0"
        )
        c.register_listener(lambda msgs: again.extend(m.body for m in msgs))
        await c.start()
        try:
            await wait_for(lambda: len(again) >= 3, what="3 new messages")
            await asyncio.sleep(0.3)
        finally:
            await c.shutdown()
        assert sorted(again) == [b"12", b"13", b"14"]

    cluster.run(main())


class SendRecorder:
    """A plugin observing the client's send and consume hooks (the in-process broker calls them too)."""

    def __init__(self) -> None:
        self.before: list[str] = []
        self.after: list[tuple[str, str]] = []
        self.consumed: list[tuple[str, str]] = []

    @hookimpl
    def tidemq_before_send(self, context: Any) -> None:
        if context.side == "client":
            self.before.append(context.topic)

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        if context.side == "client":
            self.after.append((context.broker_address, context.status))

    @hookimpl
    def tidemq_after_consume(self, context: Any) -> None:
        if context.side == "client":
            self.consumed.append((context.topic, context.status))


def test_blocking_facade_and_send_hooks(cluster: Cluster) -> None:
    topic, group = unique("Blocking"), unique("CG")
    recorder = SendRecorder()
    pm = get_plugin_manager()
    name = pm.register(recorder, name=unique("recorder"))
    try:
        with BlockingProducer(unique("PG"), cluster.ns) as p:
            r = p.send(Message(topic, b"one"))
            fut = p.send_async(Message(topic, b"two"))
            assert fut.result(10).status is SendStatus.SEND_OK
            p.send_batch([Message(topic, b"three"), Message(topic, b"four")])
        got: list[bytes] = []
        c = BlockingPushConsumer(group, cluster.ns, consume_from="first", suspend_s=1.0)
        c.subscribe(topic)
        c.register_listener(lambda msgs: got.extend(m.body for m in msgs))
        with c:
            deadline = time.monotonic() + 15
            while len(got) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert sorted(got) == [b"four", b"one", b"three", b"two"]
        assert r.status is SendStatus.SEND_OK
        assert recorder.before.count(topic) == 3
        assert [s for _, s in recorder.after] == ["SEND_OK"] * 3
        assert recorder.consumed.count((topic, "CONSUME_SUCCESS")) == 4
        from tidemq.client import BlockingPullConsumer

        with BlockingPullConsumer(unique("PC"), cluster.ns) as pc:
            found = [m for q in pc.fetch_subscribe_queues(topic) for m in pc.pull(q, "*", 0, 32).messages]
        assert len(found) == 4
        assert (topic, "FOUND") in recorder.consumed  # pull consumers report through the same hooks
    finally:
        pm.hook_manager.unregister(name=name)


# ---------------------------------------------------------------------------- fault avoidance


class AttemptRecorder:
    """Every client-side send attempt: (broker address, status)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, str]] = []

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        if context.side == "client":
            self.attempts.append((context.broker_address, context.status))


def _spawn_broker(tmp: Path, name: str, ns: str) -> tuple[Any, str]:
    import subprocess

    cfg = tmp / f"{name}.toml"
    cfg.write_text(
        f'[broker]\nname = "{name}"\nregister_interval_s = 1.0\n\n'
        "[store.mmap]\ncommitlog_file_size = 8388608\nconsumequeue_entries = 10000\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidemq",
            "broker",
            "-c",
            str(cfg),
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            ns,
            "--data-dir",
            str(tmp / name),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        pytest.fail(f"broker subprocess did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[1]


def test_sends_survive_a_killed_broker_and_it_is_retried_after_its_penalty(tmp_path: Path) -> None:
    import signal

    c = Cluster(tmp_path)
    recorder = AttemptRecorder()
    pm = get_plugin_manager()
    name = pm.register(recorder, name=unique("attempts"))
    proc = None
    try:
        c.run(c.start_namesrv())
        broker_a = c.run(c.start_broker("broker-a"))
        proc, addr_b = _spawn_broker(tmp_path, "broker-b", c.ns)
        topic = unique("Failover")

        async def main() -> None:
            await create_topic(c.ns, broker_a.address, topic)
            await create_topic(c.ns, addr_b, topic)
            await wait_route(c.ns, topic, brokers=2)
            # A failure counts as 30 s latency: penalise it for 1 s instead of 10 min.
            table = {"not_available_ms": [0, 0, 1000, 1000, 1000, 1000, 1000]}
            async with Producer(unique("PG"), c.ns, selector_options=table, send_timeout=5.0) as p:
                before = [await p.send(Message(topic, b"before-%d" % i)) for i in range(8)]
                assert {r.queue.broker_name for r in before} == {"broker-a", "broker-b"}
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                recorder.attempts.clear()
                after = [await p.send(Message(topic, b"after-%d" % i)) for i in range(30)]
                assert all(
                    r.status is SendStatus.SEND_OK and r.queue.broker_name == "broker-a" for r in after
                )
                failed_on_b = [a for a in recorder.attempts if a[0] == addr_b]
                assert 1 <= len(failed_on_b) <= 2  # then avoided for its penalty
                assert all(status.startswith("FAILED") for _, status in failed_on_b)
                assert not p.selector.is_available("broker-b")
                await asyncio.sleep(1.1)
                assert p.selector.is_available("broker-b")  # penalty over: tried again
                recorder.attempts.clear()
                later = [await p.send(Message(topic, b"later-%d" % i)) for i in range(6)]
                assert all(r.queue.broker_name == "broker-a" for r in later)
                assert any(a[0] == addr_b for a in recorder.attempts)

        c.run(main())
    finally:
        pm.hook_manager.unregister(name=name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        c.run(c.stop())
        c.loop.stop()


async def register_hanging_broker(ns: str, name: str, topics: list[str]) -> tuple[Any, Any]:
    """A TCP endpoint that accepts and never answers, registered with the NameServer as a master.

    Returns (server, registration client); both must stay open while the route is needed.
    """
    import orjson

    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    table = {
        t: {
            "topicName": t,
            "readQueueNums": 2,
            "writeQueueNums": 2,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
            "order": False,
        }
        for t in topics
    }
    body = orjson.dumps(
        {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": table,
                "dataVersion": {"timestamp": 1, "counter": 1},
            },
            "filterServerList": [],
        }
    )
    fields = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "DefaultCluster",
        "haServerAddr": "",
        "brokerId": 0,
        "compressed": False,
    }
    client = get_plugin_manager().create("transport", "tcp").client()
    resp = await client.invoke(ns, RemotingCommand.request(RequestCode.REGISTER_BROKER, fields, body), 5.0)
    assert resp.code == ResponseCode.SUCCESS, resp
    return server, client


def test_send_timeout_and_a_hanging_broker_is_avoided(cluster: Cluster) -> None:
    from tidemq.client import SendFailedError
    from tidemq.remoting.errors import RemotingTimeoutError

    only_hang, shared = unique("HangOnly"), unique("HangShared")

    async def main() -> None:
        await create_topic(cluster.ns, cluster.brokers["broker-a"].address, shared)
        server, reg = await register_hanging_broker(cluster.ns, unique("broker-hang"), [only_hang, shared])
        try:
            await wait_route(cluster.ns, shared, brokers=2)
            async with Producer(unique("PG"), cluster.ns, send_timeout=0.5) as p:
                begin = time.monotonic()
                with pytest.raises(SendFailedError) as info:
                    await p.send(Message(only_hang, b"nobody answers"))
                assert time.monotonic() - begin < 2.0
                assert any(isinstance(e, RemotingTimeoutError) for e in info.value.errors)
                # On a topic served by both, the hanging broker costs at most one send, then is avoided.
                outcomes = []
                for i in range(12):
                    try:
                        outcomes.append((await p.send(Message(shared, b"%d" % i))).queue.broker_name)
                    except SendFailedError:
                        outcomes.append("failed")
                assert outcomes.count("failed") <= 1
                assert outcomes[-10:] == ["broker-a"] * 10
        finally:
            await reg.close()
            server.close()

    cluster.run(main())


def test_offset_by_timestamp_and_assign_style_polling(cluster: Cluster) -> None:
    topic, group = unique("FromTs"), unique("CG")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            q0 = (await p.publish_queues(topic))[0]
            for i in range(5):
                await p.send_to_queue(Message(topic, b"old-%d" % i), q0)
            await asyncio.sleep(0.05)
            cut = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            for i in range(5):
                await p.send_to_queue(Message(topic, b"new-%d" % i), q0)
        async with PullConsumer(group, cluster.ns) as c:
            assert await c.search_offset(q0, cut) == 5
            await c.assign([q0])
            assert c.position(q0) == 0  # no committed offset: the queue's first offset
            c.seek(q0, await c.search_offset(q0, cut))
            got = await c.poll(max_nums=32, timeout=0.5)
            assert [m.body for m in got] == [b"new-%d" % i for i in range(5)]
            assert c.position(q0) == 10
            await c.commit()
            assert await c.poll(timeout=0.2) == []
        async with PullConsumer(group, cluster.ns) as again:
            assert await again.fetch_consume_offset(q0) == 10
            await again.assign([q0])
            assert again.position(q0) == 10  # resumes from the commit

    cluster.run(main())


def test_search_offset_boundary_type_among_messages_of_one_store_time(cluster: Cluster) -> None:
    """300 messages of one store time (one batch) between two singles: the client's and the admin
    client's search_offset answer the batch's first offset with LOWER (the default) and its last
    with UPPER, as Java's DefaultMQAdminExt.searchOffset(mq, ts, boundaryType) does (before:
    the client had no boundary type, and its searches answered the first)."""
    topic = unique("SameTs")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            q0 = (await p.publish_queues(topic))[0]
            await p.send_to_queue(Message(topic, b"before"), q0)
            await asyncio.sleep(0.05)
            batch = [Message(topic, b"same-%d" % i) for i in range(300)]
            await p.send_batch_to_queue(batch, q0)
            await asyncio.sleep(0.05)
            await p.send_to_queue(Message(topic, b"after"), q0)
        broker = cluster.brokers["broker-a"]
        store = broker.store
        same = store.get_store_time(topic, q0.queue_id, 1)
        assert {store.get_store_time(topic, q0.queue_id, i) for i in range(1, 301)} == {same}
        async with PullConsumer(unique("CG"), cluster.ns) as c:
            assert await c.search_offset(q0, same) == 1
            assert await c.search_offset(q0, same, BoundaryType.LOWER) == 1
            assert await c.search_offset(q0, same, BoundaryType.UPPER) == 300
            assert await c.search_offset(q0, same + 1, BoundaryType.UPPER) == 300
            assert await c.search_offset(q0, same + 1) == 301
        admin = AdminClient(cluster.ns)
        try:
            addr = broker.address
            assert await admin.search_offset(addr, topic, q0.queue_id, same) == 1
            assert await admin.search_offset(addr, topic, q0.queue_id, same, BoundaryType.UPPER) == 300
        finally:
            await admin.close()

    cluster.run(main())


def test_orderly_order_holds_when_a_second_consumer_joins(cluster: Cluster) -> None:
    topic, group = unique("OrderJoin"), unique("CG")
    keys = [f"key-{k}" for k in range(8)]

    async def main() -> None:
        seen: dict[str, list[int]] = {}

        def listener(msgs: list[MessageExt]) -> None:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                seen.setdefault(key, []).append(int(seq))
            time.sleep(0.002)

        async with Producer(unique("PG"), cluster.ns) as p:
            await p.publish_queues(topic)
            await p.send(Message(topic, b"warm:0"))
            await wait_route(cluster.ns, topic)
            # default 20 s rebalance: the join notification and the lock retry must carry the handover
            c1 = push_consumer(cluster.ns, group, topic)
            c2 = push_consumer(cluster.ns, group, topic)
            c1.register_listener(listener, orderly=True)
            c2.register_listener(listener, orderly=True)
            await c1.start()
            try:
                for seq in range(40):
                    if seq == 15:
                        await c2.start()  # queues move from c1 to c2 mid-stream
                    for key in keys:
                        await p.send_orderly(Message(topic, f"{key}:{seq}".encode()), key)
                    await asyncio.sleep(0.01)
                await wait_for(
                    lambda: all(len(seen.get(k, [])) >= 40 for k in keys), what="every key's 40 messages"
                )
                assert {q for q in c2.assigned_queues() if q.topic == topic}
            finally:
                await c2.shutdown()
                await c1.shutdown()
        for key in keys:
            assert seen[key] == list(range(40)), key

    cluster.run(main())


def test_shutdown_lets_in_flight_messages_finish_and_commits_them(cluster: Cluster) -> None:
    topic, group = unique("Graceful"), unique("CG")

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(6):
                await p.send(Message(topic, b"%d" % i))
        started = asyncio.Event()
        loop = asyncio.get_running_loop()
        finished: list[bytes] = []

        def slow(msgs: list[MessageExt]) -> None:
            loop.call_soon_threadsafe(started.set)
            time.sleep(0.4)
            finished.extend(m.body for m in msgs)

        c = push_consumer(cluster.ns, group, topic, consume_threads=8)
        c.register_listener(slow)
        await c.start()
        await started.wait()
        await c.shutdown()  # while listeners are still sleeping
        assert sorted(finished) == [b"%d" % i for i in range(6)]
        again: list[bytes] = []
        c = push_consumer(cluster.ns, group, topic)
        c.register_listener(lambda msgs: again.extend(m.body for m in msgs))
        await c.start()
        await asyncio.sleep(1.0)
        await c.shutdown()
        assert again == []  # everything finished was committed

    cluster.run(main())


class Veto:
    """A plugin refusing client-side sends to one topic (an ACL or quota would do this)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic

    @hookimpl
    def tidemq_before_send(self, context: Any) -> str | None:
        if context.side == "client" and context.topic == self.topic:
            return "quota exceeded"
        return None


def test_a_before_send_plugin_can_refuse_a_send(cluster: Cluster) -> None:
    from tidemq.client import SendRefusedError

    topic = unique("Veto")
    pm = get_plugin_manager()
    name = pm.register(Veto(topic), name=unique("veto"))

    async def main() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            with pytest.raises(SendRefusedError, match="quota exceeded"):
                await p.send(Message(topic, b"no"))
            assert (await p.send(Message(unique("Other"), b"yes"))).status is SendStatus.SEND_OK

    try:
        cluster.run(main())
    finally:
        pm.hook_manager.unregister(name=name)
