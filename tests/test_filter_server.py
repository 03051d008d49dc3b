"""`tidemq filtersrv` end to end: registered through the broker into the route, serving filtered pulls."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from tidemq.client.route import loads_lenient
from tidemq.message import Prop, iter_messages, properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(90)

TOPIC = "FilterSrv"


async def call(
    client: Any, addr: str, code: int, fields: dict[str, Any], body: bytes | None = None
) -> RemotingCommand:
    return await client.invoke(
        addr, RemotingCommand.request(code, {k: str(v) for k, v in fields.items()}, body), 10.0
    )


def props_of(i: int) -> dict[str, str]:
    p = {"n": str(i), "city": ("paris", "berlin", "lisbon")[i % 3], Prop.TAGS: ("TagA", "TagB")[i % 2]}
    if i % 10 == 0:
        del p["city"]
    return p


def pull_fields(offset: int, expression: str, expression_type: str, group: str = "CG-fs") -> dict[str, Any]:
    return {
        "consumerGroup": group,
        "topic": TOPIC,
        "queueId": 0,
        "queueOffset": offset,
        "maxMsgNums": 8,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": expression,
        "subVersion": 0,
        "expressionType": expression_type,
    }


async def pull_all(client: Any, addr: str, expression: str, expression_type: str) -> list[int]:
    offset, got = 0, []
    for _ in range(500):
        resp = await call(
            client, addr, RequestCode.PULL_MESSAGE, pull_fields(offset, expression, expression_type)
        )
        if resp.code == ResponseCode.SUCCESS:
            got.extend(int(m.body) for m in iter_messages(resp.payload()))
        elif resp.code not in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND):
            raise AssertionError(f"{resp.code} {resp.remark}")
        nxt = int(resp.ext_fields["nextBeginOffset"])
        if resp.code == ResponseCode.PULL_NOT_FOUND or nxt == offset:
            return got
        offset = nxt
    raise AssertionError("did not reach the end of the queue")


def test_filter_server_registers_and_serves_filtered_pulls(spawn: Any, tmp_path: Path) -> None:
    ns_port, broker_port = free_port(), free_port()
    cluster = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{ns_port}",
        "--broker-listen",
        f"127.0.0.1:{broker_port}",
    )
    ns, broker = cluster.addresses["namesrv"], cluster.addresses["broker"]
    fs = spawn("filtersrv", "--broker", broker, "--register-interval", "1")
    fs_addr = fs.addresses["filtersrv"]

    async def main() -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            for i in range(50):
                fields = {
                    "producerGroup": "PG",
                    "topic": TOPIC,
                    "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": 1,
                    "queueId": 0,
                    "sysFlag": 0,
                    "bornTimestamp": int(time.time() * 1000),
                    "flag": 0,
                    "properties": properties_to_string(props_of(i)),
                    "reconsumeTimes": 0,
                    "unitMode": "false",
                }
                resp = await call(client, broker, RequestCode.SEND_MESSAGE, fields, b"%d" % i)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            # The broker passes the filter server to the NameServer; consumers find it in the route.
            deadline = time.monotonic() + 20
            while True:
                resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
                route = loads_lenient(resp.payload()) if resp.code == ResponseCode.SUCCESS else {}
                if (route.get("filterServerTable") or {}).get(broker) == [fs_addr]:
                    break
                assert time.monotonic() < deadline, f"filter server not in the route: {route}"
                await asyncio.sleep(0.2)

            cases = [
                (
                    "SQL92",
                    "city = 'paris' AND n >= 20",
                    lambda p: p.get("city") == "paris" and int(p["n"]) >= 20,
                ),
                ("SQL92", "city IS NULL", lambda p: "city" not in p),
                ("TAG", "TagB", lambda p: p[Prop.TAGS] == "TagB"),
            ]
            for expression_type, expression, want in cases:
                got = await pull_all(client, fs_addr, expression, expression_type)
                assert got == [i for i in range(50) if want(props_of(i))], expression

            bad = await call(client, fs_addr, RequestCode.PULL_MESSAGE, pull_fields(0, "city =", "SQL92"))
            assert (
                bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
                and "at the end of the expression" in bad.remark
            )
            # Issue 20, item 7: a 50 000-term expression is refused in one line, at once.
            huge = " OR ".join(f"n = {i}" for i in range(50_000))
            start = time.perf_counter()
            resp = await call(client, fs_addr, RequestCode.PULL_MESSAGE, pull_fields(0, huge, "SQL92"))
            assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, (
                resp.code,
                (resp.remark or "")[-300:],
            )
            assert "too long" in resp.remark and time.perf_counter() - start < 1.0
            unknown = await call(client, fs_addr, RequestCode.PULL_MESSAGE, pull_fields(0, "x", "GROOVY"))
            assert (
                unknown.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "not installed" in unknown.remark
            )
            upload = await call(
                client,
                fs_addr,
                RequestCode.REGISTER_MESSAGE_FILTER_CLASS,
                {"consumerGroup": "CG"},
                b"class X {}",
            )
            assert upload.code == ResponseCode.SYSTEM_ERROR and "plugin" in upload.remark
        finally:
            await client.close()

    asyncio.run(main())
    # Once the filter server stops, the broker drops it from its registration.
    assert fs.stop() == 0

    async def gone() -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            deadline = time.monotonic() + 20
            while True:
                resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
                route = loads_lenient(resp.payload())
                if not (route.get("filterServerTable") or {}).get(broker):
                    return
                assert time.monotonic() < deadline, "filter server still in the route"
                await asyncio.sleep(0.2)
        finally:
            await client.close()

    asyncio.run(gone())
