"""SQL92 subscriptions against a real broker over TCP: exact results, pre-check, errors, the switch."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq.broker import Broker
from tidemq.config import DEFAULT_PLUGINS, BrokerSettings, Config, NamesrvSettings, compose
from tidemq.message import Prop, iter_messages, properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def running(
    data_dir: Path, store: str = "mmap", namesrv: list[str] | None = None, **settings: Any
) -> AsyncIterator[tuple[Broker, Any]]:
    cfg = Config(
        broker=BrokerSettings(
            listen="127.0.0.1:0", namesrv=namesrv or [], data_dir=str(data_dir), **settings
        ),
        plugins={**DEFAULT_PLUGINS, "store": store},
    )
    broker = Broker(compose(cfg))
    await broker.start()
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        yield broker, client
    finally:
        await client.close()
        await broker.stop()


async def call(
    client: Any, addr: str, code: int, fields: dict[str, Any], body: bytes | None = None
) -> RemotingCommand:
    return await client.invoke(
        addr, RemotingCommand.request(code, {k: str(v) for k, v in fields.items()}, body), 5.0
    )


async def send(client: Any, addr: str, topic: str, body: bytes, props: dict[str, str]) -> None:
    fields = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string(props),
        "reconsumeTimes": 0,
        "unitMode": "false",
    }
    resp = await call(client, addr, RequestCode.SEND_MESSAGE, fields, body)
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def pull_fields(
    topic: str, offset: int, expression: str, expression_type: str = "SQL92", max_nums: int = 32
) -> dict[str, Any]:
    return {
        "consumerGroup": "CG",
        "topic": topic,
        "queueId": 0,
        "queueOffset": offset,
        "maxMsgNums": max_nums,
        "sysFlag": 4,  # FLAG_SUBSCRIPTION: the expression travels with the pull
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": expression,
        "subVersion": 0,
        "expressionType": expression_type,
    }


async def pull_all(
    client: Any, addr: str, topic: str, expression: str, expression_type: str = "SQL92"
) -> list[bytes]:
    """Pull from offset 0 to the end following nextBeginOffset, as a consumer does."""
    offset, got = 0, []
    for _ in range(1000):
        resp = await call(
            client, addr, RequestCode.PULL_MESSAGE, pull_fields(topic, offset, expression, expression_type)
        )
        if resp.code == ResponseCode.SUCCESS:
            got.extend(m.body for m in iter_messages(resp.payload()))
        elif resp.code not in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND):
            raise AssertionError(f"pull failed: {resp.code} {resp.remark}")
        nxt = int(resp.ext_fields["nextBeginOffset"])
        if resp.code == ResponseCode.PULL_NOT_FOUND or nxt == offset:
            return got
        offset = nxt
    raise AssertionError("pulling did not reach the end")


def mixed(i: int) -> dict[str, str]:
    """Mixed tags and properties: some messages lack ``n`` or ``region``, some carry no tag."""
    props = {"n": str(i)}
    if i % 4:
        props[Prop.TAGS] = ("TagA", "TagB", "TagC")[i % 3]
    if i % 5 != 0:
        props["region"] = ("eu", "us", "ap")[i % 3]
    if i % 7 == 0:
        del props["n"]
    return props


EXPECTED: list[tuple[str, Any]] = [
    ("n > 50", lambda p: "n" in p and int(p["n"]) > 50),
    (
        "region = 'eu' AND TAGS IN ('TagA', 'TagB')",
        lambda p: p.get("region") == "eu" and p.get(Prop.TAGS) in ("TagA", "TagB"),
    ),
    (
        "TAGS IS NULL OR n BETWEEN 10 AND 12",
        lambda p: Prop.TAGS not in p or ("n" in p and 10 <= int(p["n"]) <= 12),
    ),
    ("region NOT IN ('eu') AND n IS NOT NULL", lambda p: "region" in p and p["region"] != "eu" and "n" in p),
    ("NOT (n < 90)", lambda p: "n" in p and not int(p["n"]) < 90),
]


@pytest.mark.parametrize("store", ["mmap", "memory"])
def test_sql92_pulls_return_exactly_the_matching_messages(tmp_path: Path, store: str) -> None:
    async def main() -> None:
        async with running(tmp_path, store) as (broker, client):
            addr = broker.address
            topic = "Mixed"
            props = [mixed(i) for i in range(60)]
            for i, p in enumerate(props):
                await send(client, addr, topic, b"%d" % i, p)
            for expression, want in EXPECTED:
                got = await pull_all(client, addr, topic, expression)
                assert got == [b"%d" % i for i, p in enumerate(props) if want(p)], expression
            # The first pulls registered the filters: messages sent from now on get bloom words,
            # and pulling them again skips non-matching entries without reading them.
            precheck = broker.filters["SQL92"].precheck
            assert sorted(precheck.registered(topic)) == sorted(e for e, _ in EXPECTED)
            more = [mixed(i) for i in range(60, 120)]
            for i, p in enumerate(more, start=60):
                await send(client, addr, topic, b"%d" % i, p)
            # The words are computed on the bit map's thread, off the put path: a pull ahead of it
            # reads the entries (correct answers, nothing skipped), so wait for it here.
            assert precheck.drain(10.0)
            before = precheck.skipped
            for expression, want in EXPECTED:
                got = await pull_all(client, addr, topic, expression)
                assert got == [b"%d" % i for i, p in enumerate(props + more) if want(p)], expression
            assert precheck.skipped - before > 100
            # TAG subscriptions on the same topic are unaffected.
            tagged = await pull_all(client, addr, topic, "TagA", "TAG")
            assert tagged == [b"%d" % i for i, p in enumerate(props + more) if p.get(Prop.TAGS) == "TagA"]

    asyncio.run(main())


def test_invalid_expression_is_refused_with_its_reason(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as (broker, client):
            await send(client, broker.address, "T", b"x", {"a": "1"})
            resp = await call(
                client, broker.address, RequestCode.PULL_MESSAGE, pull_fields("T", 0, "a > AND b")
            )
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "column 5: unexpected 'AND'" in resp.remark
            resp = await call(
                client, broker.address, RequestCode.PULL_MESSAGE, pull_fields("T", 0, "a = 1", "NOPE")
            )
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "NOPE" in resp.remark
            # The broker keeps serving valid subscriptions.
            assert await pull_all(client, broker.address, "T", "a = 1") == [b"x"]

    asyncio.run(main())


def check_body(expression: str, expression_type: str = "SQL92") -> bytes:
    """CheckClientRequestBody as the Java client sends it before starting a consumer."""
    sub = {
        "topic": "T",
        "subString": expression,
        "expressionType": expression_type,
        "tagsSet": [],
        "codeSet": [],
        "subVersion": 1,
        "classFilterMode": False,
    }
    return orjson.dumps({"clientId": "127.0.0.1@1", "group": "CG", "subscriptionData": sub})


def test_check_client_config_reports_parse_errors_at_subscribe_time(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as (broker, client):
            ok = await call(
                client, broker.address, RequestCode.CHECK_CLIENT_CONFIG, {}, check_body("a BETWEEN 1 AND 2")
            )
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            bad = await call(
                client, broker.address, RequestCode.CHECK_CLIENT_CONFIG, {}, check_body("a BETWEEN 2 AND 1")
            )
            assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "low bound of BETWEEN" in bad.remark
            tag = await call(
                client, broker.address, RequestCode.CHECK_CLIENT_CONFIG, {}, check_body("a || b", "TAG")
            )
            assert tag.code == ResponseCode.SUCCESS

    asyncio.run(main())


def test_property_filter_switch_off_refuses_sql92_like_rocketmq(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, enable_property_filter=False) as (broker, client):
            await send(client, broker.address, "T", b"x", {"a": "1", Prop.TAGS: "TagA"})
            resp = await call(client, broker.address, RequestCode.PULL_MESSAGE, pull_fields("T", 0, "a = 1"))
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert resp.remark == "The broker does not support consumer to filter message by SQL92"
            check = await call(
                client, broker.address, RequestCode.CHECK_CLIENT_CONFIG, {}, check_body("a = 1")
            )
            assert check.code == ResponseCode.SYSTEM_ERROR and "SQL92" in check.remark
            assert await pull_all(client, broker.address, "T", "TagA", "TAG") == [b"x"]

    asyncio.run(main())


def test_tidemq_push_consumer_with_a_sql92_subscription(tmp_path: Path) -> None:
    from tidemq.client import ConsumeStatus, Message, MessageExt, Producer, PushConsumer
    from tidemq.namesrv import NameServer

    async def main() -> None:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp_path / "ns")),
            get_plugin_manager().create("transport", "tcp"),
        )
        await ns.start()
        try:
            async with running(tmp_path / "b", namesrv=[ns.address]) as (broker, _client):
                async with Producer("PG", ns.address) as p:
                    for i in range(40):
                        await p.send(
                            Message(
                                "SqlPush", b"%d" % i, tags=("TagA", "TagB")[i % 2], properties={"n": str(i)}
                            )
                        )
                got: list[MessageExt] = []

                async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
                    got.extend(msgs)
                    return ConsumeStatus.SUCCESS

                c = PushConsumer(
                    "CG-sql", ns.address, consume_from="first", suspend_s=1.0, pull_error_delay_s=0.2
                )
                c.subscribe("SqlPush", "TAGS = 'TagA' AND n >= 20", "SQL92")
                c.register_listener(listener)
                await c.start()
                try:
                    deadline = time.monotonic() + 20
                    while len(got) < 10 and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.3)
                finally:
                    await c.shutdown()
                assert sorted(int(m.body) for m in got) == list(range(20, 40, 2))
        finally:
            await ns.stop()

    asyncio.run(main())


# Issue 20, item 7: hostile SQL92 subscriptions must be refused in one line, at once, and never stall
# the loop the other clients share.
HUGE = " OR ".join(f"a{i} = {i}" for i in range(50_000))
DEEP = "NOT (" * 3000 + "a = 1" + ")" * 3000


def test_huge_and_deep_expressions_answer_parse_failed_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as (broker, client):
            addr = broker.address
            await send(client, addr, "T", b"x", {"a": "1"})
            for expression in (HUGE, DEEP, "(" * 20_000):
                start = time.perf_counter()
                resp = await call(client, addr, RequestCode.PULL_MESSAGE, pull_fields("T", 0, expression))
                took = time.perf_counter() - start
                assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, (resp.code, resp.remark[:300])
                assert "\n" not in resp.remark
                assert took < 0.5, f"answered in {took:.2f} s"
                check = await call(client, addr, RequestCode.CHECK_CLIENT_CONFIG, {}, check_body(expression))
                assert check.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, (check.code, check.remark[:300])
                assert "\n" not in check.remark and len(check.remark) < 1000
            assert await pull_all(client, addr, "T", "a = 1") == [b"x"]

    asyncio.run(main())


def test_a_thousand_distinct_subscriptions_stay_exact_and_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as (broker, client):
            addr = broker.address
            topic = "Many"
            await send(client, addr, topic, b"first", {"n": "0"})
            for i in range(1000):
                resp = await call(
                    client, addr, RequestCode.PULL_MESSAGE, pull_fields(topic, 0, f"n = {i} OR n > 100000")
                )
                assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), resp.remark
            precheck = broker.filters["SQL92"].precheck
            registered = precheck.registered(topic)
            assert 0 < len(registered) <= 64, len(registered)
            for i in range(1, 40):
                await send(client, addr, topic, b"%d" % i, {"n": str(i)})
            assert precheck.drain(10.0)
            # Registered or not, every subscription gets exactly its messages.
            for i in (0, 1, 5, 39, 500, 999):
                got = await pull_all(client, addr, topic, f"n = {i} OR n > 100000")
                assert got == ([b"first"] if i == 0 else [b"%d" % i] if i < 40 else []), i

    asyncio.run(main())
