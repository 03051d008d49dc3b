"""The official client (rocketmq==0.4.4, rocketmq-client-cpp) finds brokers through our NameServer.

A stand-in broker built on the tcp transport answers the send, so this checks only what the
NameServer and codec own: the route JSON the C++ client parses, and the frames it exchanges.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

from tidemq.config import NamesrvSettings
from tidemq.namesrv import NameServer
from tidemq.remoting import RemotingCommand, RequestCode
from tidemq.remoting.protocol import DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigSerializeWrapper
from tidemq_transport_tcp import TcpTransport, new_event_loop

pytest.importorskip("rocketmq.client")
pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]

PRODUCER = textwrap.dedent(
    """
    import sys
    from rocketmq.client import Producer, Message
    p = Producer("PID-compat")
    p.set_namesrv_addr(sys.argv[1])
    p.start()
    m = Message("TopicTest")
    m.set_keys("k1")
    m.set_tags("tagA")
    m.set_body("hello")
    ret = p.send_sync(m)
    print("SENT", int(ret.status), ret.offset, flush=True)
    p.shutdown()
    """
)


def test_official_producer_routes_through_our_namesrv() -> None:
    seen: list[tuple[str, int, dict[str, str], bytes]] = []
    ready = threading.Event()
    stop = threading.Event()
    address: dict[str, str] = {}

    async def broker(conn: Any, req: RemotingCommand) -> RemotingCommand:
        seen.append(("broker", req.code, dict(req.ext_fields), req.payload()))
        if req.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2):
            return req.reply(
                ext_fields={"msgId": "7F00000100002A9F0000000000000001", "queueId": 0, "queueOffset": 41}
            )
        return req.reply()

    async def main() -> None:
        ns = NameServer(NamesrvSettings(listen="127.0.0.1:0"), TcpTransport())
        handle = ns.processor.handle

        async def spy(conn: Any, req: RemotingCommand) -> RemotingCommand:
            seen.append(("namesrv", req.code, dict(req.ext_fields), req.payload()))
            return await handle(conn, req)

        ns.processor.handle = spy  # type: ignore[method-assign]
        await ns.start()
        server = TcpTransport().server("127.0.0.1", 0, broker)
        await server.start()
        client = TcpTransport().client()
        broker_addr = "{}:{}".format(*server.address)
        body = RegisterBrokerBody(
            TopicConfigSerializeWrapper({"TopicTest": TopicConfig("TopicTest", 4, 4)}, DataVersion(1, 1))
        ).encode()
        reg = RemotingCommand.request(
            RequestCode.REGISTER_BROKER,
            {"brokerName": "broker-a", "brokerAddr": broker_addr, "clusterName": "C", "brokerId": 0},
            body,
        )
        assert (await client.invoke(ns.address, reg, 3)).code == 0
        address["ns"] = ns.address
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await client.close()
        await server.stop()
        await ns.stop()

    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        out = subprocess.run(
            [sys.executable, "-c", PRODUCER, address["ns"]], capture_output=True, text=True, timeout=60
        )
        assert "SENT 0 41" in out.stdout, out.stdout + out.stderr
    finally:
        stop.set()
        thread.join(10)
    route_queries = [s for s in seen if s[0] == "namesrv" and s[1] == RequestCode.GET_ROUTEINFO_BY_TOPIC]
    assert route_queries and route_queries[0][2]["topic"] == "TopicTest"
    sends = [s for s in seen if s[0] == "broker" and s[1] in (10, 310)]
    assert len(sends) == 1 and sends[0][3] == b"hello" and sends[0][2]["topic"] == "TopicTest"
