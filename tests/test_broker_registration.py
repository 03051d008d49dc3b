"""Broker registration with NameServers: at start, on topic changes, and when a NameServer comes late."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.broker import Broker
from tidemq.client.route import TopicRoute
from tidemq.config import DEFAULT_PLUGINS, BrokerSettings, Config, NamesrvSettings, compose
from tidemq.message import properties_to_string
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def route(client: Any, namesrv: str, topic: str) -> TopicRoute | None:
    resp = await client.invoke(
        namesrv, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 3
    )
    return TopicRoute.from_json(topic, resp.body) if resp.code == ResponseCode.SUCCESS and resp.body else None


async def eventually_route(client: Any, namesrv: str, topic: str, within_s: float) -> TopicRoute:
    deadline = time.monotonic() + within_s
    while True:
        r = await route(client, namesrv, topic)
        if r is not None or time.monotonic() > deadline:
            assert r is not None, f"no route for {topic} after {within_s} s"
            return r
        await asyncio.sleep(0.1)


def test_late_namesrv_and_new_topics_are_registered_promptly(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    ns_addr = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        transport = get_plugin_manager().create("transport", "tcp")
        # register_interval_s is long: anything seen below comes from the prompt paths.
        settings = BrokerSettings(
            listen="127.0.0.1:0", namesrv=[ns_addr], data_dir=str(tmp_path), register_interval_s=300
        )
        broker = Broker(compose(Config(broker=settings, plugins={**DEFAULT_PLUGINS, **plugin_matrix})))
        await broker.start()  # the NameServer is not up yet: start must not fail
        ns = NameServer(NamesrvSettings(listen=ns_addr), transport)
        await ns.start()
        client = transport.client()
        try:
            tbw = await eventually_route(client, ns_addr, "TBW102", within_s=10)
            assert tbw.addresses() == {"broker-a": broker.address}
            assert tbw.queue_datas[0].perm == 7  # read, write and inherit: new topics are made from it
            fields = {
                "producerGroup": "P",
                "topic": "BornOnSend",
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 2,
                "queueId": 0,
                "bornTimestamp": 0,
                "properties": properties_to_string({}),
            }
            sent = await client.invoke(
                broker.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"x"), 3
            )
            assert sent.code == ResponseCode.SUCCESS
            born = await eventually_route(client, ns_addr, "BornOnSend", within_s=3)
            assert [(q.read_queue_nums, q.write_queue_nums, q.perm) for q in born.queue_datas] == [(2, 2, 6)]
            await broker.stop()  # a stopping broker unregisters: its routes go away at once
            assert await route(client, ns_addr, "BornOnSend") is None
        finally:
            await client.close()
            await ns.stop()
            await broker.stop()

    asyncio.run(main())
