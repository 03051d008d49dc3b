"""Request-reply (RocketMQ 4.6+) against real NameServers and brokers on loopback.

The fast tests run the cluster in-process (one per module, plus one broker that does not store
replies); the broker-restart test runs the broker as a subprocess and is marked slow.  Requesters
and responders are separate client instances (their own client ids and connections), so the
broker has to route every reply to the connection of the requester that asked.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from test_client_e2e import Cluster, create_topic, push_consumer, unique, wait_for, wait_route

from tidemq import hookimpl
from tidemq.client import (
    BlockingProducer,
    BrokerError,
    ClientError,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    RequestTimeoutError,
    SendRefusedError,
    create_reply,
)
from tidemq.client import request_reply as rr
from tidemq.message import Prop, properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(tmp_path_factory.mktemp("rr"))
    try:
        c.run(c.start_namesrv())
        c.run(c.start_broker("broker-rr", max_message_size=64 * 1024))
        yield c
    finally:
        c.run(c.stop())
        c.loop.stop()


class Responder:
    """A push consumer of the request topic that answers each request with ``answer(body)``
    through its own producer (a separate client instance from the requester's)."""

    def __init__(
        self,
        ns: str,
        group: str,
        topic: str,
        *,
        delay: float = 0.0,
        answer: bool = True,
        plain_send: bool = False,
    ) -> None:
        self.plain_send = plain_send
        self.got: list[MessageExt] = []
        self.errors: list[BaseException] = []
        self.delay = delay
        self.answer = answer
        self.producer = Producer(unique("RP"), ns)
        self.consumer = push_consumer(ns, group, topic)
        self.consumer.register_listener(self.on_messages)

    async def on_messages(self, msgs: list[MessageExt]) -> ConsumeStatus:
        for msg in msgs:
            self.got.append(msg)
            if self.answer:
                asyncio.get_running_loop().create_task(self.reply(msg))
        return ConsumeStatus.SUCCESS

    async def reply(self, msg: MessageExt) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        try:
            reply = create_reply(msg, b"re:" + msg.body)
            # A plain send of a reply goes as SEND_REPLY_MESSAGE_V2 too, as RocketMQ's client sends it.
            await (self.producer.send(reply) if self.plain_send else self.producer.send_reply(reply))
        except Exception as exc:
            self.errors.append(exc)

    async def __aenter__(self) -> Responder:
        await self.producer.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.shutdown()
        await self.producer.shutdown()


async def new_topic(cluster: Cluster) -> str:
    topic = unique("RRT")
    broker = next(iter(cluster.brokers.values()))
    await create_topic(cluster.ns, broker.address, topic, queues=4)
    await wait_route(cluster.ns, topic)
    return topic


async def wait_assigned(consumers: list[Any], topic: str, queues: int = 4) -> None:
    """Until the responders' rebalance hands out all ``queues`` of ``topic``."""

    def assigned() -> int:
        return sum(len([q for q in c.process_queues if q.topic == topic]) for c in consumers)

    await wait_for(lambda: assigned() >= queues, 15.0, "responders' queues")


def stored_replies(cluster: Cluster, name: str = "broker-rr") -> int:
    return int(cluster.brokers[name].store.get_max_offset_in_queue(REPLY_TOPIC, 0))


def test_request_round_trip_sync_async_selector_queue_and_blocking(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with (
            Responder(cluster.ns, unique("RG"), topic) as responder,
            Producer(unique("RQ"), cluster.ns) as p,
        ):
            await wait_assigned([responder.consumer], topic)
            before = stored_replies(cluster)
            msg = Message(topic, b"ping", properties={"k": "v"})
            reply = await p.request(msg, timeout=5.0)
            assert reply.body == b"re:ping"
            # The request carries what prepareSendRequest sets; the reply answers it.
            assert msg.properties[Prop.REPLY_TO_CLIENT] == p.instance.client_id
            assert msg.properties[Prop.MESSAGE_TTL] == "5000"
            assert reply.properties[Prop.CORRELATION_ID] == msg.properties[Prop.CORRELATION_ID]
            assert reply.properties[Prop.MESSAGE_TYPE] == "reply"
            assert reply.topic == REPLY_TOPIC
            assert (
                Prop.PUSH_REPLY_TIME in reply.properties
                and Prop.REPLY_MESSAGE_ARRIVE_TIME in reply.properties
            )
            seen = responder.got[-1]
            assert seen.properties[Prop.CORRELATION_ID] == msg.properties[Prop.CORRELATION_ID]
            assert seen.properties["k"] == "v"

            # The async form, with a callback.
            called: list[tuple[Any, Any]] = []
            task = p.request_async(Message(topic, b"async"), 5.0, lambda r, e: called.append((r, e)))
            assert (await task).body == b"re:async"
            assert called and called[0][1] is None and called[0][0].body == b"re:async"

            # A selector (and its argument), and a given queue.
            queues = await p.publish_queues(topic)
            picked: list[Any] = []

            def selector(qs: Any, m: Message, arg: Any) -> Any:
                picked.append(arg)
                return qs[arg % len(qs)]

            assert (await p.request(Message(topic, b"sel"), 5.0, selector=selector, arg=3)).body == b"re:sel"
            assert picked == [3] and responder.got[-1].queue_id == queues[3].queue_id
            assert (await p.request_to_queue(Message(topic, b"q1"), queues[1], 5.0)).body == b"re:q1"
            assert responder.got[-1].queue_id == queues[1].queue_id
            # Replies are stored too (store_reply_message_enable defaults to true).
            assert stored_replies(cluster) == before + 4

    cluster.run(main())
    # The blocking facade, on its own loop thread.
    topic = cluster.run(new_topic(cluster))

    async def serve() -> Responder:
        r = Responder(cluster.ns, unique("RG"), topic)
        await r.__aenter__()
        await wait_assigned([r.consumer], topic)
        return r

    responder = cluster.run(serve())
    try:
        with BlockingProducer(unique("RQ"), cluster.ns) as bp:
            assert bp.request(Message(topic, b"blocking"), 5.0).body == b"re:blocking"
    finally:
        cluster.run(responder.__aexit__())


def test_several_requesters_and_responders_get_their_own_replies(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        group = unique("RG")
        responders = [Responder(cluster.ns, group, topic) for _ in range(2)]
        requesters = [Producer(unique("RQ"), cluster.ns) for _ in range(3)]
        for r in responders:
            await r.__aenter__()
        for p in requesters:
            await p.start()
        try:
            await wait_for(
                lambda: all(
                    len([q for q in r.consumer.process_queues if q.topic == topic]) == 2 for r in responders
                ),
                25.0,
                "rebalance",
            )

            async def ask(i: int, p: Producer) -> None:
                for n in range(10):
                    body = f"{i}-{n}".encode()
                    reply = await p.request(Message(topic, body), 5.0)
                    assert reply.body == b"re:" + body

            await asyncio.gather(*(ask(i, p) for i, p in enumerate(requesters)))
            # Both responders answered (the queues are split between them).
            assert all(r.got for r in responders)
            assert not any(r.errors for r in responders)
        finally:
            for p in requesters:
                await p.shutdown()
            for r in responders:
                await r.__aexit__()

    cluster.run(main())


def test_no_reply_times_out_and_a_late_reply_is_dropped_and_counted(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with (
            Responder(cluster.ns, unique("RG"), topic, delay=1.0) as late,
            Producer(unique("RQ"), cluster.ns) as p,
        ):
            await wait_assigned([late.consumer], topic)
            dropped = rr.late_replies()
            begin = time.monotonic()
            with pytest.raises(RequestTimeoutError) as info:
                await p.request(Message(topic, b"slow"), timeout=0.4)
            took = time.monotonic() - begin
            assert 0.35 <= took < 1.5, took
            assert "wait reply message timeout, 400 ms" in str(info.value)
            assert isinstance(info.value, ClientError) and info.value.timeout == 0.4
            # The reply comes after the timeout: pushed (the requester is connected), then dropped.
            await wait_for(lambda: rr.late_replies() == dropped + 1, 10.0, "the late reply")
            assert not late.errors
            assert info.value.correlation_id not in rr.REQUESTS.futures

            # The callback form also times out, through the table's timer.
            seen: list[Any] = []
            task = p.request_async(Message(topic, b"slow2"), 0.3, lambda r, e: seen.append((r, e)))
            with pytest.raises(RequestTimeoutError):
                await task
            assert seen and seen[0][0] is None and isinstance(seen[0][1], RequestTimeoutError)

            # A topic the broker creates on the request: CLUSTER comes from the auto-create route.
            auto = Message(unique("AUTO"), b"nobody listens")
            with pytest.raises(RequestTimeoutError):
                await p.request(auto, 0.3)
            assert auto.properties[Prop.CLUSTER] == "DefaultCluster"

    cluster.run(main())


async def _requester_gone(cluster: Cluster, broker: str, caplog: pytest.LogCaptureFixture) -> BrokerError:
    """A request whose requester leaves before the responder answers: the answer's error."""
    topic = unique("RRT")
    await create_topic(cluster.ns, cluster.brokers[broker].address, topic, queues=4)
    await wait_route(cluster.ns, topic)
    async with Responder(cluster.ns, unique("RG"), topic, answer=False) as responder:
        await wait_assigned([responder.consumer], topic)
        p = Producer(unique("RQ"), cluster.ns)
        await p.start()
        task = asyncio.get_running_loop().create_task(p.request(Message(topic, b"bye"), 10.0))
        await wait_for(lambda: bool(responder.got), 10.0, "the request")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await p.shutdown()  # unregisters from the broker and closes its connection
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tidemq"):
            for _ in range(5):  # several answers: one warning, no storm, no error
                with pytest.raises(BrokerError) as info:
                    await responder.producer.send_reply(create_reply(responder.got[0], b"too late"))
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        warnings = [r for r in caplog.records if r.name.startswith("tidemq.broker")]
        assert not errors, errors
        assert len(warnings) <= 1, warnings
        return info.value


def test_requester_gone_reply_is_refused_clearly_and_stored(cluster: Cluster, caplog) -> None:
    before = stored_replies(cluster)
    error = cluster.run(_requester_gone(cluster, "broker-rr", caplog))
    assert error.code == ResponseCode.SYSTEM_ERROR
    assert "push reply message fail, channel of <" in str(error.remark) and "not found" in str(error.remark)
    assert stored_replies(cluster) == before + 5  # stored although nobody got it (RocketMQ does)


def test_requester_gone_reply_is_dropped_when_replies_are_not_stored(cluster: Cluster, caplog) -> None:
    # A second broker of another cluster, that does not store replies.
    cluster.run(cluster.start_broker("broker-nostore", cluster="NoStore", store_reply_message_enable=False))
    error = cluster.run(_requester_gone(cluster, "broker-nostore", caplog))
    assert error.code == ResponseCode.SYSTEM_ERROR and "not found" in str(error.remark)
    store = cluster.brokers["broker-nostore"].store
    assert store.get_max_offset_in_queue("NoStore_REPLY_TOPIC", 0) == 0


class ReplyRecorder:
    """Records the send hooks' view of replies, and refuses replies whose body says so."""

    def __init__(self) -> None:
        self.before: list[tuple[str, str]] = []
        self.after: list[tuple[str, str, str]] = []

    @hookimpl
    def tidemq_before_send(self, context: Any) -> str | None:
        if context.topic == REPLY_TOPIC:
            self.before.append((context.side, context.producer_group))
            if context.properties.get("veto") == "yes":
                return "replies with veto=yes are refused"
        return None

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        if context.topic == REPLY_TOPIC:
            self.after.append((context.side, context.status, context.msg_id))


def test_replies_pass_the_send_hooks_and_count_in_the_topic_stats(cluster: Cluster) -> None:
    recorder = ReplyRecorder()
    pm = get_plugin_manager()
    name = pm.register(recorder, name=unique("reply-recorder"))

    async def main() -> None:
        topic = await new_topic(cluster)
        stats = cluster.brokers["broker-rr"].stats
        async with (
            Responder(cluster.ns, unique("RG"), topic) as responder,
            Producer(unique("RQ"), cluster.ns) as p,
        ):
            await wait_assigned([responder.consumer], topic)
            counter = stats.topic_puts.get(REPLY_TOPIC)
            before = counter.nums if counter is not None else 0
            assert (await p.request(Message(topic, b"hooked"), 5.0)).body == b"re:hooked"
            group = responder.producer.group
            assert ("broker", group) in recorder.before and ("client", group) in recorder.before
            await wait_for(lambda: len(recorder.after) >= 2, 5.0, "after_send")
            sides = {side: status for side, status, _ in recorder.after}
            assert sides == {"broker": "SUCCESS", "client": "SEND_OK"}
            assert stats.topic_puts[REPLY_TOPIC].nums == before + 1
            # A plugin's veto refuses a reply as it refuses a send (the client's hook runs first).
            veto = create_reply(responder.got[-1], b"no")
            veto.properties["veto"] = "yes"
            with pytest.raises(SendRefusedError, match="veto=yes"):
                await responder.producer.send_reply(veto)
            # The broker's own check, reached by a raw frame (no client hook).
            client = pm.create("transport", "tcp").client()
            try:
                props = dict(veto.properties)
                fields = {"a": "PG", "b": REPLY_TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1"}
                fields |= {"h": "0", "i": properties_to_string(props)}
                req = RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE_V2, fields, b"no")
                resp = await client.invoke(cluster.brokers["broker-rr"].address, req, 5.0)
            finally:
                await client.close()
            assert resp.code == ResponseCode.NO_PERMISSION and "veto=yes" in str(resp.remark)
            # SEND_REPLY_MESSAGE (324), with the long header names, for a request nobody waits for:
            # pushed to the requester, which answers SUCCESS, drops it and counts it.
            late = rr.late_replies()
            props = {Prop.REPLY_TO_CLIENT: p.instance.client_id, Prop.CORRELATION_ID: "raw-324"}
            fields = {"producerGroup": "PG", "topic": REPLY_TOPIC, "defaultTopic": "TBW102"}
            fields |= {"defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "1"}
            fields |= {"flag": "0", "properties": properties_to_string(props)}
            client = pm.create("transport", "tcp").client()
            try:
                req = RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, fields, b"raw")
                resp = await client.invoke(cluster.brokers["broker-rr"].address, req, 5.0)
            finally:
                await client.close()
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert rr.late_replies() == late + 1

    try:
        cluster.run(main())
    finally:
        pm.hook_manager.unregister(name=name)


def test_hostile_reply_frames_get_clear_answers(cluster: Cluster) -> None:
    async def main() -> None:
        addr = cluster.brokers["broker-rr"].address
        client = get_plugin_manager().create("transport", "tcp").client()

        async def ask(code: int, fields: dict[str, Any], body: bytes = b"x") -> RemotingCommand:
            return await client.invoke(addr, RemotingCommand.request(code, fields, body), 5.0)

        def v2(props: dict[str, str], **over: Any) -> dict[str, Any]:
            f = {"a": "PG", "b": REPLY_TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0"}
            f["i"] = properties_to_string(props)
            f.update(over)
            return f

        try:
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, {})
            assert r.code == ResponseCode.SYSTEM_ERROR and "lacks the field" in str(r.remark)
            r = await ask(RequestCode.SEND_REPLY_MESSAGE, {"producerGroup": "PG", "topic": REPLY_TOPIC})
            assert r.code == ResponseCode.SYSTEM_ERROR and "lacks the field" in str(r.remark)
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}, e="zero"))
            assert r.code == ResponseCode.SYSTEM_ERROR and "not an integer" in str(r.remark)
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}))
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert r.remark == "reply message properties[REPLY_TO_CLIENT] is null"
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({Prop.REPLY_TO_CLIENT: "1.2.3.4@nobody"}))
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert r.remark == "push reply message fail, channel of <1.2.3.4@nobody> not found."
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}), b"")
            assert r.code == ResponseCode.MESSAGE_ILLEGAL
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}), b"z" * (65 * 1024))
            assert r.code == ResponseCode.MESSAGE_ILLEGAL and "max_message_size" in str(r.remark)
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}, b="bad/topic"))
            assert r.code == ResponseCode.SYSTEM_ERROR
            r = await ask(RequestCode.SEND_REPLY_MESSAGE_V2, v2({}, e="99"))
            assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in str(r.remark)
            # Still serving.
            r = await ask(RequestCode.GET_BROKER_RUNTIME_INFO, {})
            assert r.code == ResponseCode.SUCCESS
        finally:
            await client.close()

    cluster.run(main())


def test_client_side_checks_and_hostile_pushes() -> None:
    with pytest.raises(ClientError, match=r"property\[CLUSTER\] is null"):
        create_reply(Message("T", b"x"), b"y")
    reply = create_reply(
        Message(
            "T",
            b"x",
            properties={
                Prop.CLUSTER: "C1",
                Prop.CORRELATION_ID: "cid",
                Prop.REPLY_TO_CLIENT: "me",
                Prop.MESSAGE_TTL: "3000",
            },
        ),
        b"y",
    )
    assert reply.topic == "C1_REPLY_TOPIC" and reply.body == b"y"
    assert reply.properties == {
        Prop.MESSAGE_TYPE: "reply",
        Prop.CORRELATION_ID: "cid",
        Prop.REPLY_TO_CLIENT: "me",
        Prop.MESSAGE_TTL: "3000",
    }
    bad = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, {"sysFlag": "nope"}, b"x")
    answer = rr.receive_reply(bad)
    assert answer is not None and answer.code == ResponseCode.SYSTEM_ERROR
    # A push for no waiting request is answered SUCCESS, dropped and counted.
    before = rr.late_replies()
    stray = RemotingCommand.request(
        RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT,
        {"sysFlag": "0", "topic": "T", "properties": properties_to_string({Prop.CORRELATION_ID: "nobody"})},
        b"x",
    )
    answer = rr.receive_reply(stray)
    assert answer is not None and answer.code == ResponseCode.SUCCESS
    assert rr.late_replies() == before + 1


# ---------------------------------------------------------------------------- broker restart
@pytest.mark.slow
def test_request_across_a_broker_restart(spawn, tmp_path: Path) -> None:
    """A subprocess broker restarted on the same port and data: a request in flight during the
    restart fails clearly (its reply never comes: RequestTimeoutError, or the send fails); a
    request after the restart succeeds once the requester's heartbeat told the broker about it."""
    from test_delay_schedule import MQ

    mq = MQ(spawn, tmp_path)

    async def main() -> None:
        topic = unique("RRT")
        await create_topic(mq.ns, mq.broker_addr, topic, queues=4)
        await wait_route(mq.ns, topic)
        async with (
            Responder(mq.ns, unique("RG"), topic, delay=0.5) as responder,
            Producer(unique("RQ"), mq.ns) as p,  # heartbeats every 30 s
        ):
            await wait_assigned([responder.consumer], topic)
            assert (await p.request(Message(topic, b"before"), 5.0)).body == b"re:before"
            in_flight = asyncio.get_running_loop().create_task(p.request(Message(topic, b"during"), 3.0))
            await wait_for(lambda: any(m.body == b"during" for m in responder.got), 10.0, "the request")
            mq.stop_broker()  # before the responder's reply (0.5 s later)
            with pytest.raises(ClientError) as info:
                await in_flight
            assert isinstance(info.value, RequestTimeoutError), info.value
            mq.start_broker()
            await wait_route(mq.ns, topic)
            # The restarted broker knows the requester again from a heartbeat: the one it sends at
            # once after an unanswered request (not 30 s later), so at most one more request fails.
            failed: list[BaseException] = []
            for _ in range(3):
                try:
                    reply = await p.request(Message(topic, b"after"), 3.0)
                    break
                except ClientError as exc:
                    failed.append(exc)
            else:
                raise AssertionError(f"no request succeeded after the restart: {failed}")
            assert reply.body == b"re:after"
            assert len(failed) <= 1, failed

    asyncio.run(main())


REQUESTER = textwrap.dedent(
    """
    import asyncio, sys
    from tidemq.client import Message, Producer

    async def main(ns, topic, name, count, timeout):
        async with Producer("RQ_" + name, ns) as p:
            for n in range(count):
                body = f"{name}-{n}".encode()
                reply = await p.request(Message(topic, body), timeout)
                print(reply.body.decode(), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
    """
)


async def _requester(ns: str, topic: str, name: str, count: int, timeout: float) -> Any:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        REQUESTER,
        ns,
        topic,
        name,
        str(count),
        str(timeout),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
@pytest.mark.parametrize("store", [True, False])
def test_real_processes_requesters_responders_and_a_killed_requester(
    spawn, tmp_path: Path, store: bool
) -> None:
    """Broker, NameServer and requesters are processes of their own: two requester processes get
    their own replies from two responders; a requester killed (SIGKILL) before its reply leaves
    the responder a clear SYSTEM_ERROR, the reply stored or not as ``store_reply_message_enable``
    says, and nothing logged at ERROR by the broker."""
    from test_delay_schedule import MQ

    mq = MQ(spawn, tmp_path, store_reply_message_enable=store)

    async def reply_offset(api: Any) -> int:
        from tidemq.queues import MessageQueue

        return int(await api.get_max_offset(mq.broker_addr, MessageQueue(REPLY_TOPIC, "broker-d", 0)))

    async def main() -> None:
        topic, lonely = unique("RRT"), unique("RRL")
        for t in (topic, lonely):
            await create_topic(mq.ns, mq.broker_addr, t, queues=4)
            await wait_route(mq.ns, t)
        group = unique("RG")
        async with (
            Responder(mq.ns, group, topic) as r1,
            Responder(mq.ns, group, topic) as r2,
            Responder(mq.ns, unique("RG"), lonely, answer=False) as silent,
        ):
            await wait_assigned([r1.consumer, r2.consumer], topic)
            await wait_assigned([silent.consumer], lonely)
            api = r1.producer.instance.require_api()
            stored_before = await reply_offset(api)
            procs = [await _requester(mq.ns, topic, name, 10, 10.0) for name in ("A", "B")]
            outs = [await p.communicate() for p in procs]
            for name, proc, (out, err) in zip(("A", "B"), procs, outs, strict=True):
                assert proc.returncode == 0, err.decode()[-2000:]
                assert out.decode().split() == [f"re:{name}-{n}" for n in range(10)]
            assert not r1.errors and not r2.errors

            doomed = await _requester(mq.ns, lonely, "K", 1, 30.0)
            await wait_for(lambda: bool(silent.got), 20.0, "the doomed request")
            doomed.kill()
            await doomed.wait()
            await asyncio.sleep(0.3)  # the broker sees the connection close
            with pytest.raises(BrokerError) as info:
                await silent.producer.send_reply(create_reply(silent.got[0], b"too late"))
            assert info.value.code == ResponseCode.SYSTEM_ERROR
            assert "not found" in str(info.value.remark)
            stored = await reply_offset(api) - stored_before
            assert stored == (21 if store else 0)

    asyncio.run(main())
    log_text = mq.broker.log_path.read_text()
    assert " ERROR " not in log_text and "Traceback" not in log_text, log_text[-3000:]


def test_a_reply_sent_with_a_plain_send_reaches_the_requester(cluster: Cluster) -> None:
    async def main() -> None:
        topic = await new_topic(cluster)
        async with (
            Responder(cluster.ns, unique("RG"), topic, plain_send=True) as responder,
            Producer(unique("RQ"), cluster.ns) as p,
        ):
            await wait_assigned([responder.consumer], topic)
            reply = await p.request(Message(topic, b"plain"), 5.0)
            assert reply.body == b"re:plain" and not responder.errors

    cluster.run(main())
